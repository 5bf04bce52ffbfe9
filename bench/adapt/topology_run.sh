#!/bin/bash
# Adaptive topology on an emulated cluster: 4 hosts (netns-cluster), one rank each, all
# links at RATE. Each job allreduces SIZE per iteration; after THROTTLE_AT iterations host
# SLOW_HOST's link drops to SLOW_RATE (both directions). Two jobs, one after the other on
# the same cluster: the default strategy throughout ("off"), and the adaptive_topology
# policy, which sees throughput fall below 0.8 of its reference, votes, and swaps. Prints
# both timelines and the median algorithm bandwidth over the last TAIL iterations of each,
# with their ratio. Needs root and iproute2; tears the cluster down on exit.
#
# Usage: bench/adapt/topology_run.sh  (settings through the environment, defaults below)
#   BUILD=build RATE=1gbit SLOW_RATE=250mbit SLOW_HOST=4 SIZE=33554432 ITERS=24
#   THROTTLE_AT=10 TAIL=8 NETNS_CLUSTER=../shared/tools/netns-cluster
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
RUN=$BUILD/tools/taiji-run
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
export RATE=${RATE:-1gbit}
SLOW_RATE=${SLOW_RATE:-250mbit} SLOW_HOST=${SLOW_HOST:-4} HOSTS=4
SIZE=${SIZE:-33554432} ITERS=${ITERS:-24} THROTTLE_AT=${THROTTLE_AT:-10} TAIL=${TAIL:-8}
BURST=${BURST:-64kb} LIMIT=${LIMIT:-1mb}
JOB_TIMEOUT=${JOB_TIMEOUT:-900}
PORT=29450

die() { echo "topology_run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -x "$RUN" ] || die "no $RUN; build first"
[ -r "$CLUSTER" ] || die "no netns-cluster at $CLUSTER (set NETNS_CLUSTER)"
OUT=$(mktemp -d /tmp/taiji-adapt-topology.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

shape() {  # shape RATE: host SLOW_HOST's link, both directions
  tc -n tjn-h"$SLOW_HOST" qdisc replace dev veth0 root tbf rate "$1" burst "$BURST" limit "$LIMIT"
  tc -n tjn-sw qdisc replace dev p"$SLOW_HOST" root tbf rate "$1" burst "$BURST" limit "$LIMIT"
}
HOST_LIST=$(for i in $(seq 1 $HOSTS); do printf '10.251.0.%s:1,' "$i"; done)
HOST_LIST=${HOST_LIST%,}
THROTTLE="tc -n tjn-h$SLOW_HOST qdisc replace dev veth0 root tbf rate $SLOW_RATE burst $BURST limit $LIMIT && tc -n tjn-sw qdisc replace dev p$SLOW_HOST root tbf rate $SLOW_RATE burst $BURST limit $LIMIT"

timeout 60 bash "$CLUSTER" up $HOSTS >/dev/null
job() {  # job NAME POLICY
  local i rc=0
  shape "$RATE"
  PIDS=()
  for i in $(seq 1 $HOSTS); do
    timeout -k 10 $((JOB_TIMEOUT + 30)) ip netns exec tjn-h"$i" env PYTHONPATH="$ROOT/python" \
      TAIJI_LIBRARY="$BUILD/capi/libtaiji.so" "$RUN" --hosts "$HOST_LIST" --self 10.251.0."$i" \
      --port $PORT --job-id "$1-$$" --timeout "$JOB_TIMEOUT" /usr/bin/python3 \
      "$ROOT/bench/adapt/topology_job.py" --size "$SIZE" --iters "$ITERS" \
      --throttle-at "$THROTTLE_AT" --throttle-cmd "$THROTTLE" --policy "$2" \
      >"$OUT/$1.$i" 2>&1 </dev/null &
    PIDS+=($!)
  done
  for i in $(seq 1 $HOSTS); do wait "${PIDS[$((i - 1))]}" || rc=$?; done
  PIDS=()
  [ $rc = 0 ] || { for i in $(seq 1 $HOSTS); do echo "--- host $i"; cat "$OUT/$1.$i"; done; die "$1 failed"; }
  sed -n 's/^\[0\] //p' "$OUT/$1.1" | grep '^{' >"$OUT/$1.json"
}

echo "== 4 hosts at $RATE; host $SLOW_HOST drops to $SLOW_RATE after iteration $THROTTLE_AT; allreduce $SIZE bytes"
job default off
job adaptive adaptive_topology
/usr/bin/python3 - "$OUT" "$TAIL" <<'PY'
import json, statistics, sys
out, tail = sys.argv[1], int(sys.argv[2])
runs = {n: [json.loads(l) for l in open(f"{out}/{n}.json")] for n in ("default", "adaptive")}
print(f"{'iter':>4}  {'default Gbit/s':>14}  {'adaptive Gbit/s':>15}  adaptive topology / action")
for a, b in zip(runs["default"], runs["adaptive"]):
    print(f"{a['iter']:>4}  {a['gbps']:>14.3f}  {b['gbps']:>15.3f}  {b['topology']} {b['action']}")
med = {n: statistics.median(r["gbps"] for r in rows[-tail:]) for n, rows in runs.items()}
print(f"median of the last {tail}: default {med['default']:.3f} Gbit/s, adaptive "
      f"{med['adaptive']:.3f} Gbit/s, ratio {med['adaptive'] / med['default']:.2f}")
PY
