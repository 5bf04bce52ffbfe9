#!/usr/bin/env bash
# Checks taiji-run --elastic --hosts: two launchers on this machine as the hosts 127.0.0.1
# and 127.0.0.2 (loopback addresses) follow one job through the first one's store. A grow's
# ranks are claimed in the store and start once, on a host with a free slot; a grow beyond
# the slots starts nothing; a lost rank leaves the job; a launcher whose ranks have ended
# stays while the job runs elsewhere; --min-np stops every host. The ranks are shell
# scripts; the test writes the membership with store_tool.py, as rank 0 would.
# Usage: test_elastic_hosts.sh path/to/taiji-run path/to/store_tool.py
set -euo pipefail

RUN=${1:?usage: test_elastic_hosts.sh path/to/taiji-run path/to/store_tool.py}
TOOL=${2:?usage: test_elastic_hosts.sh path/to/taiji-run path/to/store_tool.py}
unset TAIJI_LISTEN_HOST TAIJI_RANK TAIJI_WORLD_SIZE TAIJI_RENDEZVOUS TAIJI_JOB_ID TAIJI_CLUSTER_VERSION
command -v python3 >/dev/null || { echo "FAIL - python3 is missing" >&2; exit 1; }
TMP=$(mktemp -d)
A= B=
cleanup() {
  for p in $A $B; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

FAIL_FILES="$(echo "$TMP"/a.out "$TMP"/a.err "$TMP"/b.out "$TMP"/b.err)"
. "$(dirname "$0")/lib.sh"



count() { cat "$TMP"/a.out "$TMP"/b.out | grep -c "$1" || true; }
lines() { [ "$(grep -c "$1" "$TMP/$2" || true)" -ge "$3" ]; }
pid_of() { sed -n "s/^\[$1\] env .* pid \([0-9]*\)$/\1/p" "$TMP"/a.out "$TMP"/b.out | tail -n 1; }

# Each rank prints its variables and pid, then waits for the file $TMP/done (all ranks) or
# $TMP/done.<rank> (that rank alone) and exits 0.
RANK='echo "env $TAIJI_RANK $TAIJI_WORLD_SIZE $TAIJI_CLUSTER_VERSION $TAIJI_LOCAL_RANK $TAIJI_LOCAL_SIZE $TAIJI_LISTEN_HOST pid $$"
  while [ ! -e "$0" ] && [ ! -e "$0.$TAIJI_RANK" ]; do sleep 0.1; done'

# start HOSTS NP ARGS...: both launchers in the background, the first serving the store on a
# free port; returns once NP ranks are up.
start() {
  local hosts=$1 np=$2 attempt port
  shift 2
  rm -f "$TMP"/done* "$TMP"/{a,b}.{out,err}
  touch "$TMP"/{a,b}.{out,err}
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    "$RUN" --timeout 60 --hosts "$hosts" --self 127.0.0.1 --port "$port" -np "$np" --elastic "$@" \
      sh -c "$RANK" "$TMP/done" >"$TMP/a.out" 2>"$TMP/a.err" </dev/null &
    A=$!
    wait_for 10 lines 'elastic job' a.err 1 || ! kill -0 "$A" 2>/dev/null || break
    if ! kill -0 "$A" 2>/dev/null && grep -q 'cannot serve the rendezvous' "$TMP/a.err"; then
      wait "$A" || true
      continue  # port taken: try another
    fi
    break
  done
  "$RUN" --timeout 60 --hosts "$hosts" --self 127.0.0.2 --port "$port" -np "$np" --elastic "$@" \
    sh -c "$RANK" "$TMP/done" >"$TMP/b.out" 2>"$TMP/b.err" </dev/null &
  B=$!
  ADDR=127.0.0.1:$port
  wait_for 20 eval '[ "$(count "^\[[0-9]*\] env")" -ge "$np" ]' || fail "start: the ranks did not start"
  wait_for 10 lines 'elastic job' b.err 1 || fail "start: the second launcher did not start"
}

# --- usage ----------------------------------------------------------------------------
RC=0
timeout -s KILL 20 "$RUN" --hosts 127.0.0.1:2 --self 127.0.0.1 --elastic -np 3 true \
  >"$TMP/a.out" 2>"$TMP/a.err" </dev/null || RC=$?
[ "$RC" = 2 ] || fail "--elastic -np above the --hosts slots: exit code $RC, expected 2"
grep -q 'more than the 2 slots listed in --hosts' "$TMP/a.err" || fail "-np above the slots: no message"
ok "--elastic --hosts refuses an -np above the hosts' slots"

# --- grow onto the free slots, beyond them, a loss, a grow into the freed slot ---------
JOB=hosts-test-$$
start 127.0.0.1:2,127.0.0.2:2 2 --job-id "$JOB"
[ "$(sort "$TMP/a.out" | sed 's/ pid .*//')" = "[0] env 0 2 1 0 2 127.0.0.1
[1] env 1 2 1 1 2 127.0.0.1" ] || fail "start: host 1 does not run ranks 0 and 1 of 2"
wait_for 10 lines 'no rank runs here yet; staying while 2 ranks run on other hosts' b.err 1 || fail "start: host 2 does not say it waits"
[ ! -s "$TMP/b.out" ] || fail "start: host 2 started a rank"
ok "-np 2 fills the first host's 2 slots; the second host's launcher waits with none"

store set "$JOB/elastic/cluster" "2 4"
wait_for 20 eval '[ "$(count "^\[3\] env")" = 1 ]' || fail "grow to 4: rank 3 did not start"
sleep 0.5  # a second start would come within this
[ "$(sort "$TMP/b.out" | sed 's/ pid .*//')" = "[2] env 2 4 2 0 2 127.0.0.2
[3] env 3 4 2 1 2 127.0.0.2" ] || fail "grow to 4: host 2 does not run ranks 2 and 3 of 4"
[ "$(count '^\[[23]\] env')" = 2 ] || fail "grow to 4: a rank started twice"
[ "$(store get "$JOB/elastic/v2/claim/2")" = 127.0.0.2 ] || fail "grow to 4: rank 2 is not claimed by 127.0.0.2"
[ "$(store get "$JOB/elastic/v2/claim/3")" = 127.0.0.2 ] || fail "grow to 4: rank 3 is not claimed by 127.0.0.2"
grep -q 'membership version 2: starting rank 2, 3 here' "$TMP/b.err" || fail "grow to 4: no message on host 2"
grep -q 'membership version 2: no free slot here for rank 2, 3 (2 in use)' "$TMP/a.err" ||
  fail "grow to 4: host 1 does not say it has no slot"
[ "$(store get "$JOB/elastic/running")" = 4 ] || fail "grow to 4: J/elastic/running is not 4"
ok "J/elastic/cluster = 2 4 starts ranks 2 and 3 once, on the host with free slots, claimed in the store"

store set "$JOB/elastic/cluster" "3 5"
wait_for 20 lines 'membership version 3: no free slot here for rank 4' a.err 1 || fail "grow to 5: host 1 says nothing"
wait_for 20 lines 'membership version 3: no free slot here for rank 4' b.err 1 || fail "grow to 5: host 2 says nothing"
RC=0
store get "$JOB/elastic/v3/claim/4" >/dev/null || RC=$?
[ "$RC" = 3 ] || fail "grow to 5 beyond the slots: rank 4 was claimed"
[ "$(count '^\[4\]')" = 0 ] || fail "grow to 5 beyond the slots: a rank 4 started"
ok "a grow beyond the hosts' slots claims and starts nothing, and every launcher says so"

# The runtime's grow to 5 timed out; a shrink back to 4, then rank 3 (on host 2) is lost.
store set "$JOB/elastic/cluster" "4 4"
wait_for 20 lines 'membership version 4 has 4 ranks (was 5)' b.err 1 || fail "back to 4: no message"
kill -KILL "$(pid_of 3)"
wait_for 20 lines 'rank 3 killed by signal 9 (Killed); it leaves the job, 1 rank goes on here' b.err 1 ||
  fail "lost rank: no message"
kill -0 "$B" 2>/dev/null || fail "lost rank: host 2's launcher stopped"
store set "$JOB/elastic/cluster" "5 3"
for f in a.err b.err; do
  wait_for 20 lines 'membership version 5 has 3 ranks (was 4)' $f 1 || fail "shrink to 3: no message in $f"
done
store set "$JOB/elastic/cluster" "6 4"
wait_for 20 eval '[ "$(count "^\[3\] env")" = 2 ]' || fail "grow to 4 again: rank 3 did not start again"
[ "$(grep '^\[3\] env' "$TMP/b.out" | tail -n 1 | sed 's/ pid .*//')" = "[3] env 3 4 6 1 2 127.0.0.2" ] ||
  fail "grow to 4 again: the new rank 3 does not have version 6 and the freed slot 1"
[ "$(store get "$JOB/elastic/v6/claim/3")" = 127.0.0.2 ] || fail "grow to 4 again: rank 3 is not claimed by 127.0.0.2"
ok "a rank lost on host 2 leaves the job; the next grow starts its replacement in the freed slot"

touch "$TMP/done.0" "$TMP/done.1"
wait_for 20 lines 'no rank runs here now; staying while 2 ranks run on other hosts' a.err 1 ||
  fail "host 1's ranks ended: it does not say it stays"
kill -0 "$A" 2>/dev/null || fail "host 1's ranks ended: its launcher (the store) exited"
touch "$TMP/done"
wait_bounded "$B" 20
B=
[ "$RC" = 0 ] || fail "job end: host 2's launcher exit code $RC, expected 0"
wait_bounded "$A" 20
A=
[ "$RC" = 0 ] || fail "job end: host 1's launcher exit code $RC, expected 0"
ok "host 1's launcher serves the store until the ranks on host 2 have ended; both exit 0"

# --- a race for the same ranks, then --min-np ------------------------------------------
start 127.0.0.1:3,127.0.0.2:3 2 --min-np 2 --job-id "$JOB-race"
ADDR_RACE=$ADDR
store set "$JOB-race/elastic/cluster" "2 5"
wait_for 20 eval '[ "$(count "^\[[234]\] env")" = 3 ]' || fail "race: ranks 2..4 did not all start"
sleep 0.5
for r in 2 3 4; do
  [ "$(count "^\[$r\] env")" = 1 ] || fail "race: rank $r started $(count "^\[$r\] env") times"
  host=$(ADDR=$ADDR_RACE store get "$JOB-race/elastic/v2/claim/$r")
  file=$([ "$host" = 127.0.0.1 ] && echo a || echo b)
  grep -q "^\[$r\] env $r 5 2 [0-2] 3 $host pid" "$TMP/$file.out" ||
    fail "race: rank $r, claimed by $host, does not run there with the right env"
done
[ "$(grep -c '^\[' "$TMP/a.out")" -le 3 ] || fail "race: host 1 runs more than its 3 slots"
ok "two launchers with free slots start ranks 2..4 once each, where the store's claim says"

store set "$JOB-race/elastic/cluster" "3 1"
wait_bounded "$A" 20
A=
[ "$RC" = 1 ] || fail "below --min-np: host 1's exit code $RC, expected 1"
wait_bounded "$B" 20
B=
[ "$RC" = 1 ] || fail "below --min-np: host 2's exit code $RC, expected 1"
grep -q 'membership version 3 has 1 rank, below --min-np 2; stopping' "$TMP/b.err" ||
  fail "below --min-np: no message"
ok "a membership below --min-np stops the ranks on every host"

echo "all multi-host elastic launcher checks passed"
