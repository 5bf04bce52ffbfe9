#!/bin/bash
# Topologies from measured links on an emulated cluster: HOSTS hosts (network namespaces
# from netns-cluster), one taiji peer each, every host link at RATE. Runs
#   1. slow host: host SLOW_HOST's link at SLOW_RATE; taiji-links-bench --sweep (every
#      built-in strategy and the measured one, side by side in one job) at each SIZES;
#   2. slow paths: all links at RATE, but the paths 1->2 and 3->4 throttled to PATH_RATE
#      (the default ring, ranks in host order, crosses both); the same sweep;
#   3. mid-run: all links at RATE; a job of ITERS allreduces of ADAPT_SIZE under the
#      measured_topology policy, and after iteration THROTTLE_AT rank 0 throttles 1->2 and
#      3->4 to PATH_RATE: the timeline shows the drop, the measurement and the swap.
# Needs root and iproute2; tears the cluster down on exit. Nothing leaves the namespaces.
#
# Usage: bench/links/run.sh   (settings through the environment, defaults below)
#   BUILD=build HOSTS=4 RATE=1gbit SLOW_HOST=4 SLOW_RATE=250mbit PATH_RATE=100mbit
#   SIZES="16777216 67108864" ITERS=3 ADAPT_SIZE=16777216 ADAPT_ITERS=24 THROTTLE_AT=8
#   SCENARIOS="slow_host slow_paths mid_run" NETNS_CLUSTER=../shared/tools/netns-cluster
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
RUN=$BUILD/tools/taiji-run
BENCH=$BUILD/bench/taiji-links-bench
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
CLUSTER=$(readlink -f "$CLUSTER")
export RATE=${RATE:-1gbit}
HOSTS=${HOSTS:-4} SLOW_HOST=${SLOW_HOST:-4} SLOW_RATE=${SLOW_RATE:-250mbit} PATH_RATE=${PATH_RATE:-100mbit}
SIZES=${SIZES:-16777216 67108864} ITERS=${ITERS:-3}
ADAPT_SIZE=${ADAPT_SIZE:-16777216} ADAPT_ITERS=${ADAPT_ITERS:-24} THROTTLE_AT=${THROTTLE_AT:-8}
SCENARIOS=${SCENARIOS:-slow_host slow_paths mid_run}
BURST=${BURST:-64kb} LIMIT=${LIMIT:-1mb}
JOB_TIMEOUT=${JOB_TIMEOUT:-1200}
PORT=29470

die() { echo "run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -x "$RUN" ] && [ -x "$BENCH" ] || die "no $RUN or $BENCH; build first (meson setup build && ninja -C build)"
[ -r "$CLUSTER" ] || die "no netns-cluster at $CLUSTER (set NETNS_CLUSTER)"
[ "$HOSTS" -ge 4 ] || die "HOSTS must be at least 4 (the slow paths are 1->2 and 3->4)"

OUT=${OUT:-$(mktemp -d /tmp/taiji-links.XXXXXX)}
mkdir -p "$OUT"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

HOST_LIST=$(for i in $(seq 1 "$HOSTS"); do printf '10.251.0.%s:1,' "$i"; done)
HOST_LIST=${HOST_LIST%,}

# job NAME BENCH-ARGS...: one taiji-run per host, all bounded; rank 0 (host 1) prints.
job() {
  local name=$1; shift
  local i rc=0
  PIDS=()
  for i in $(seq 1 "$HOSTS"); do
    timeout -k 10 $((JOB_TIMEOUT + 30)) ip netns exec tjn-h"$i" "$RUN" --hosts "$HOST_LIST" \
      --self 10.251.0."$i" --port $PORT --job-id "$name-$$" --timeout "$JOB_TIMEOUT" \
      "$BENCH" "$@" >"$OUT/$name.$i" 2>&1 </dev/null &
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

cluster_up() {  # a fresh cluster, every link at RATE
  timeout 60 bash "$CLUSTER" up "$HOSTS" >/dev/null
}

sweeps() {
  local size
  for size in $SIZES; do
    echo "-- allreduce of $size B"
    job "$1-$size" --sweep --bytes "$size" --iters "$ITERS" --warmup 1
  done
}

export TAIJI_TIMEOUT_MS=${TAIJI_TIMEOUT_MS:-300000}
for s in $SCENARIOS; do
  echo
  case $s in
    slow_host)
      echo "== slow host: $HOSTS hosts at $RATE, host $SLOW_HOST at $SLOW_RATE"
      export "RATE_$SLOW_HOST=$SLOW_RATE"
      cluster_up
      unset "RATE_$SLOW_HOST"
      sweeps slow_host ;;
    slow_paths)
      echo "== slow paths: $HOSTS hosts at $RATE, 1->2 and 3->4 at $PATH_RATE"
      cluster_up
      bash "$CLUSTER" throttle 1 2 "$PATH_RATE"
      bash "$CLUSTER" throttle 3 4 "$PATH_RATE"
      sweeps slow_paths ;;
    mid_run)
      echo "== mid-run: $HOSTS hosts at $RATE; after iteration $THROTTLE_AT, 1->2 and 3->4 at $PATH_RATE"
      cluster_up
      job mid_run --adapt --bytes "$ADAPT_SIZE" --iters "$ADAPT_ITERS" --throttle-at "$THROTTLE_AT" \
        --throttle-cmd "bash $CLUSTER throttle 1 2 $PATH_RATE >/dev/null && bash $CLUSTER throttle 3 4 $PATH_RATE >/dev/null" \
        --policy "measured_topology first=0 window=3 threshold=0.8 gain=1.2 bytes=$ADAPT_SIZE" ;;
    *) die "unknown scenario $s" ;;
  esac
done
echo
echo "(logs in $OUT)"
