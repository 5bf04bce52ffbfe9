#!/bin/bash
# The netns case of bench/compare/run.sh (which sets the environment below): 4 emulated
# hosts from netns-cluster, every link at RATE, one rank per host; taiji, Gloo and Open
# MPI run the same allreduce and broadcast sizes. Rows go to OUT/results.jsonl.
# Open MPI starts its daemons through netns_rsh.sh (an rsh agent that enters the host's
# namespace) from an mpirun inside host 1. Needs root; tears the cluster down on exit.
#
# Usage: bench/compare/netns.sh BUILD OUT
#   env: NETNS_ALLREDUCE="16M 64M" NETNS_BROADCAST=64M NETNS_ITERS=3 RATE=1gbit
#        NETNS_MTU=9000 (jumbo frames on every link; default: the cluster's 1500)
#        HAVE_GLOO=1 HAVE_MPI=1 JOB_TIMEOUT=600 NETNS_CLUSTER=../shared/tools/netns-cluster
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=$1 OUT=$2
RUN=$BUILD/tools/taiji-run
BENCH=$BUILD/bench/taiji-bench
GLOO=$BUILD/bench/compare/taiji-compare-gloo
MPI=$BUILD/bench/compare/taiji-compare-mpi
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
PY=/usr/bin/python3
HOSTS=4
NETNS_ALLREDUCE=${NETNS_ALLREDUCE:-16M 64M} NETNS_BROADCAST=${NETNS_BROADCAST-64M}
ITERS=${NETNS_ITERS:-3} WARMUP=1
HAVE_GLOO=${HAVE_GLOO:-1} HAVE_MPI=${HAVE_MPI:-1}
JOB_TIMEOUT=${JOB_TIMEOUT:-600}
export RATE=${RATE:-1gbit}
mkdir -p "$OUT"
RES=$OUT/results.jsonl
note() { echo "netns.sh: $*" | tee -a "$OUT/notes.txt" >&2; }
FAILED=0
failed() { FAILED=1; note "$1 failed (exit $2); log: $3"; tail -5 "$3" >&2; }

[ "$(id -u)" = 0 ] || { note "skipping the netns case: needs root"; exit 0; }
[ -r "$CLUSTER" ] || { note "skipping the netns case: no netns-cluster at $CLUSTER"; exit 0; }
# netns-cluster's namespace names are fixed; never tear down someone else's cluster.
if ip netns list | grep -q '^tjn-'; then
  note "skipping the netns case: tjn-* namespaces exist already (another run or test uses them)"
  exit 0
fi

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
timeout 60 bash "$CLUSTER" up $HOSTS >/dev/null || { note "netns-cluster up failed"; exit 1; }
MTU=${NETNS_MTU:-}
if [ -n "$MTU" ]; then
  # tbf counts whole Ethernet frames, so at 1500 bytes TCP payload is at most 1448/1514 of
  # the link; larger frames raise that ceiling (9000: 8948/9014).
  for i in $(seq 1 $HOSTS); do
    ip -n tjn-sw link set p"$i" mtu "$MTU" && ip -n tjn-h"$i" link set veth0 mtu "$MTU" ||
      { note "cannot set MTU $MTU"; exit 1; }
  done
fi
echo "-- netns: $HOSTS hosts at $RATE${MTU:+, MTU $MTU}, one rank each; allreduce $NETNS_ALLREDUCE${NETNS_BROADCAST:+, broadcast $NETNS_BROADCAST}; $ITERS iterations"
ADDRS=$(for i in $(seq 1 $HOSTS); do printf '10.251.0.%s,' "$i"; done)
ADDRS=${ADDRS%,}
LOGN=0
next_log() { LOGN=$((LOGN + 1)); LOG="$OUT/netns-r${ROUND:-1}-$(printf %02d $LOGN)-$1.log"; }

# on_hosts LOG CMD...: CMD once per host, in host I's namespace, with I for @I@ and I-1 (the
# rank) for @R@,
# all at once; fails if any fails. Each host's output in LOG.I, its CPU times in LOG.I.time.
on_hosts() {
  local log=$1; shift
  local i rc=0 a args
  PIDS=()
  for i in $(seq 1 $HOSTS); do
    args=()
    for a in "$@"; do a=${a//@I@/$i}; args+=("${a//@R@/$((i - 1))}"); done
    ip netns exec tjn-h"$i" /usr/bin/time -f '%U %S' -o "$log.$i.time" \
      timeout -k 10 "$JOB_TIMEOUT" "${args[@]}" >"$log.$i" 2>&1 </dev/null &
    PIDS+=($!)
  done
  for i in "${PIDS[@]}"; do wait "$i" || rc=$?; done
  PIDS=()
  return $rc
}
cpu_sum() { cat "$1".*.time | awk 'NF == 2 { s += $1 + $2 } END { print s }'; }

PORT=29500
taiji() {  # taiji OP SIZE
  local op=$1 size=$2 n log json= cpu=()
  local hosts
  hosts=$(echo "$ADDRS" | sed 's/,/:1,/g; s/$/:1/')
  for n in "$ITERS" 1; do
    next_log "taiji-$op-$size-$n"; log=$LOG
    json=${json:-$log.json}
    PORT=$((PORT + 1))
    if ! on_hosts "$log" "$RUN" --hosts "$hosts" --self 10.251.0.@I@ --port $PORT \
        --job-id "cmp-$$-$LOGN" --timeout "$JOB_TIMEOUT" "$BENCH" --op "$op" -b "$size" \
        -e "$size" --iters "$n" --warmup $WARMUP --timeout-ms 300000 --json "$log.json"; then
      failed "taiji netns $op $size" $? "$log.1"; return
    fi
    cpu+=("$(cpu_sum "$log")")
  done
  $PY "$HERE/results.py" taiji netns "$json" "${cpu[0]}" "${cpu[1]}" "$ITERS" >>"$RES"
}

gloo() {  # gloo OP SIZE
  [ "$HAVE_GLOO" = 1 ] || return 0
  local log store
  next_log "gloo-$1-$2"; log=$LOG
  store=$(mktemp -d "$OUT/store.XXXXXX")
  if on_hosts "$log" "$GLOO" --rank @R@ --world $HOSTS --store "$store" \
      --host 10.251.0.@I@ --op "$1" -b "$2" -e "$2" --iters "$ITERS" --warmup $WARMUP; then
    $PY "$HERE/results.py" tag netns <"$log.1" >>"$RES"
  else
    failed "gloo netns $1 $2" $? "$log.1"
  fi
}

mpi() {  # mpi OP SIZE
  [ "$HAVE_MPI" = 1 ] || return 0
  local log hosts
  next_log "mpi-$1-$2"; log=$LOG
  hosts=$(echo "$ADDRS" | sed 's/,/:1,/g; s/$/:1/')
  if ip netns exec tjn-h1 timeout -k 10 "$JOB_TIMEOUT" mpirun --allow-run-as-root \
      --host "$hosts" -np $HOSTS --mca plm_rsh_agent "$HERE/netns_rsh.sh" \
      --mca plm_rsh_no_tree_spawn 1 --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include veth0 --mca oob_tcp_if_include veth0 \
      "$MPI" --op "$1" -b "$2" -e "$2" --iters "$ITERS" --warmup $WARMUP >"$log" 2>&1 </dev/null; then
    $PY "$HERE/results.py" tag netns <"$log" >>"$RES"
  else
    failed "mpi netns $1 $2" $? "$log"
  fi
}

for s in $NETNS_ALLREDUCE; do
  taiji allreduce "$s"; gloo allreduce "$s"; mpi allreduce "$s"
done
for s in $NETNS_BROADCAST; do
  taiji broadcast "$s"; gloo broadcast "$s"; mpi broadcast "$s"
done
exit $FAILED
