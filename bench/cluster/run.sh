#!/bin/bash
# Emulated-cluster demonstration: 4 hosts (network namespaces from netns-cluster), one
# taiji peer each, every host link at RATE except host SLOW_HOST's at SLOW_RATE. Runs
#   1. taiji-bench --sweep-topologies: the same allreduce size sweep on every built-in
#      strategy, one table with the winner per size;
#   2. taiji-bench --swap-at: a fixed-size allreduce that starts on SWAP_FROM and, after
#      SWAP_AT iterations, swaps every peer to SWAP_TO (default: the sweep's winner at its
#      largest size), printing the per-iteration timeline.
# Needs root and iproute2; tears the cluster down on exit. Nothing leaves the namespaces.
#
# Usage: bench/cluster/run.sh   (settings through the environment, defaults below)
#   BUILD=build  RATE=1gbit  SLOW_RATE=250mbit  SLOW_HOST=4  HOSTS=4
#   MIN=16M  MAX=64M  ITERS=3  TOPOLOGIES=all  SWEEP=1 (0: only the swap run)
#   SWAP_SIZE=64M  SWAP_ITERS=10  SWAP_AT=5  SWAP_FROM=ring  SWAP_TO=(sweep winner)
#   NETNS_CLUSTER=../shared/tools/netns-cluster  OUT=(a new temporary directory)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
RUN=$BUILD/tools/taiji-run
BENCH=$BUILD/bench/taiji-bench
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
export RATE=${RATE:-1gbit}
SLOW_RATE=${SLOW_RATE:-250mbit}
SLOW_HOST=${SLOW_HOST:-4}
HOSTS=${HOSTS:-4}
MIN=${MIN:-16M} MAX=${MAX:-64M} ITERS=${ITERS:-3} TOPOLOGIES=${TOPOLOGIES:-all} SWEEP=${SWEEP:-1}
SWAP_SIZE=${SWAP_SIZE:-64M} SWAP_ITERS=${SWAP_ITERS:-10} SWAP_AT=${SWAP_AT:-5}
SWAP_FROM=${SWAP_FROM:-ring} SWAP_TO=${SWAP_TO:-}
# netns-cluster's own tbf parameters, so the slow link differs from the others in rate only.
BURST=${BURST:-64kb} LIMIT=${LIMIT:-1mb}
# Bounds: a whole job, and each benchmark op (a 64 MiB ring step on a slow link takes s).
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
OP_TIMEOUT_MS=${OP_TIMEOUT_MS:-120000}
PORT=29400

die() { echo "run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -x "$RUN" ] && [ -x "$BENCH" ] || die "no $RUN or $BENCH; build first (meson setup build && ninja -C build)"
[ -r "$CLUSTER" ] || die "no netns-cluster at $CLUSTER (set NETNS_CLUSTER)"
[ "$SLOW_HOST" -ge 1 ] && [ "$SLOW_HOST" -le "$HOSTS" ] || die "SLOW_HOST must be 1..$HOSTS"

OUT=${OUT:-$(mktemp -d /tmp/taiji-cluster.XXXXXX)}
mkdir -p "$OUT"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || true; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

timeout 60 bash "$CLUSTER" up "$HOSTS"
# A link is shaped in both directions: the host's egress (veth0) and the switch port's.
if [ "$SLOW_RATE" != "$RATE" ]; then
  tc -n tjn-h"$SLOW_HOST" qdisc replace dev veth0 root tbf rate "$SLOW_RATE" burst "$BURST" limit "$LIMIT"
  tc -n tjn-sw qdisc replace dev p"$SLOW_HOST" root tbf rate "$SLOW_RATE" burst "$BURST" limit "$LIMIT"
fi
for i in $(seq 1 "$HOSTS"); do
  echo "host $i (10.251.0.$i): $(tc -n tjn-h"$i" qdisc show dev veth0 | head -1)"
done

HOST_LIST=$(for i in $(seq 1 "$HOSTS"); do printf '10.251.0.%s:1,' "$i"; done)
HOST_LIST=${HOST_LIST%,}

# job NAME BENCH-ARGS...: one taiji-run per host, all bounded; host I's output in
# $OUT/NAME.I. Rank 0 (host 1) prints the results.
job() {
  local name=$1; shift
  local i rc=0
  PIDS=()
  for i in $(seq 1 "$HOSTS"); do
    timeout -k 10 $((JOB_TIMEOUT + 30)) ip netns exec tjn-h"$i" "$RUN" --hosts "$HOST_LIST" \
      --self 10.251.0."$i" --port $PORT --job-id "$name-$$" --timeout "$JOB_TIMEOUT" \
      "$BENCH" --timeout-ms "$OP_TIMEOUT_MS" "$@" >"$OUT/$name.$i" 2>&1 </dev/null &
    PIDS+=($!)
  done
  for i in $(seq 1 "$HOSTS"); do wait "${PIDS[$((i - 1))]}" || rc=$?; done
  PIDS=()
  sed 's/^\[0\] //' "$OUT/$name.1"
  if [ $rc != 0 ]; then
    for i in $(seq 2 "$HOSTS"); do echo "--- host $i:"; cat "$OUT/$name.$i"; done
    die "$name failed (exit $rc); logs in $OUT"
  fi
}

if [ "$SWEEP" != 0 ]; then
  echo
  echo "== sweep: allreduce $MIN .. $MAX, $ITERS iterations, $HOSTS hosts at $RATE, host $SLOW_HOST at $SLOW_RATE"
  start=$SECONDS
  job sweep --sweep-topologies "$TOPOLOGIES" -b "$MIN" -e "$MAX" --iters "$ITERS" --warmup 1
  echo "(sweep took $((SECONDS - start)) s)"
fi

if [ -z "$SWAP_TO" ]; then
  if [ "$SWEEP" != 0 ]; then
    SWAP_TO=$(grep -E '^\[0\] +[0-9]+ ' "$OUT/sweep.1" | tail -1 | grep -oE '[a-z_]+ \+[0-9]+%$' |
              cut -d' ' -f1 || true)
  fi
  # Without a sweep, or when it crowned the starting strategy, swap to something else.
  if [ -z "$SWAP_TO" ] || [ "$SWAP_TO" = "$SWAP_FROM" ]; then
    if [ "$SWAP_FROM" = tree ]; then SWAP_TO=ring; else SWAP_TO=tree; fi
  fi
fi
echo
echo "== swap: allreduce $SWAP_SIZE, $SWAP_ITERS iterations, $SWAP_FROM -> $SWAP_TO after $SWAP_AT"
start=$SECONDS
job swap --topology "$SWAP_FROM" --swap-at "$SWAP_AT" --swap-to "$SWAP_TO" -e "$SWAP_SIZE" \
  --iters "$SWAP_ITERS" --warmup 1
echo "(swap run took $((SECONDS - start)) s; logs in $OUT)"
