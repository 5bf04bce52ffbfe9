#!/bin/bash
# A two-host job in an emulated cluster: network namespaces tjn-h1 and tjn-h2 from
# netns-cluster, two peers on each, one taiji-run per host as on real machines. The
# peers must find their hosts from their addresses, so hierarchical really groups them.
# Skips (77) without root, without working `ip netns`, or without the cluster script.
# Usage: test_netns.sh taiji-run taiji-bench taiji-c-consumer path/to/netns-cluster
set -u
RUN=$1 BENCH=$2 CONSUMER=$3 CLUSTER=$4
HOSTS=10.251.0.1:2,10.251.0.2:2
PORT=29400  # each namespace has its own ports, so nothing on the machine can clash

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip (iproute2)"
[ -r "$CLUSTER" ] || skip "no netns-cluster at $CLUSTER"
# The same name the cluster script probes with, so its `down` also removes a leftover.
timeout 10 ip netns add tjn-probe 2>/dev/null || skip "ip netns add fails here"
timeout 10 ip netns del tjn-probe

TMP=$(mktemp -d)
PIDS=()  # launchers still running; an early exit stops them before the teardown
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
# A signal would otherwise end the script without running the EXIT trap's teardown.
trap 'exit 130' INT TERM HUP

RATE=none timeout 60 bash "$CLUSTER" up 2 || fail "netns-cluster up 2 failed"

# job NAME ARGS...: runs ARGS under one taiji-run per host, both bounded; output of host
# I in $TMP/NAME.I. Fails unless both launchers exit 0.
job() {
  local name=$1; shift
  local h rc=0
  PIDS=()
  for h in 1 2; do
    timeout -k 5 150 ip netns exec tjn-h$h "$RUN" --hosts $HOSTS --self 10.251.0.$h \
      --port $PORT --job-id "$name-$$" --timeout 120 "$@" >"$TMP/$name.$h" 2>&1 </dev/null &
    PIDS+=($!)
  done
  for h in 1 2; do
    wait "${PIDS[$((h - 1))]}" || rc=$?
  done
  PIDS=()
  for h in 1 2; do
    echo "--- $name, host $h:"
    cat "$TMP/$name.$h"
  done
  [ $rc = 0 ] || fail "$name: a launcher exited with $rc"
}

job bench "$BENCH" --topology hierarchical -b 4 -e 4M -f 16 --iters 3 --warmup 1
grep -q '^\[0\] # check: all ok$' "$TMP/bench.1" || fail "bench: no 'check: all ok'"
rows=$(grep -cE '^\[0\] +[0-9]+ .* ok$' "$TMP/bench.1")
[ "$rows" = 6 ] || fail "bench: $rows rows checked ok, expected 6 (4 B .. 4 MiB, x16)"
! grep -q FAIL "$TMP/bench.1" || fail "bench: a row failed"

# With two hosts of two ranks hierarchical differs from ring, so the digests before and
# after the swap differ only if the peers grouped the ranks by host.
job swap "$BENCH" --topology hierarchical --swap-at 2 --swap-to ring -e 4M --iters 4 \
  --warmup 1
grep -q '^\[0\] # check: all ok$' "$TMP/swap.1" || fail "swap: no 'check: all ok'"
before=$(awk '$2 == "0" { print $7 }' "$TMP/swap.1")
after=$(awk '$2 == "3" { print $7 }' "$TMP/swap.1")
[ -n "$before" ] && [ -n "$after" ] || fail "swap: no digests in the timeline"
[ "$before" != "$after" ] ||
  fail "swap: hierarchical and ring ran on the same graphs ($before): hosts not grouped"
grep -qE '^\[0\] +0 .* hierarchical ' "$TMP/swap.1" || fail "swap: iteration 0 not on hierarchical"
grep -qE '^\[0\] +3 .* ring ' "$TMP/swap.1" || fail "swap: iteration 3 not on ring"

TAIJI_TOPOLOGY=hierarchical job consumer "$CONSUMER"
for r in 0 1 2 3; do
  h=$((r / 2 + 1))
  grep -qx "\[$r\] rank $r of 4 ok" "$TMP/consumer.$h" || fail "consumer: rank $r did not report ok"
done
echo "PASS: bench, swap and consumer across 2 namespaced hosts"
