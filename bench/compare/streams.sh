#!/bin/bash
# Would more than one TCP connection per peer pair pay? An upper bound without taiji:
# iperf3 streams in the ring pattern of a ring allreduce (rank i sends to rank i+1, all at
# once), with 1, 2 and 4 parallel connections per pair, on loopback (4 processes) and on
# the emulated cluster (4 hosts, needs root). Prints each receiver's goodput and their
# median per setting. If P connections do not beat one here, striping taiji's links over
# P connections cannot either: the allreduce moves the same bytes through the same links.
#
# Usage: bench/compare/streams.sh [--seconds S] [--rounds R] [--places lo,netns]
#   env: RATE=1gbit NETNS_MTU=9000 (jumbo frames on the cluster; default its 1500)
#        CONGESTION=cubic (iperf3 -C; default the host's) NETNS_CLUSTER=...
# Needs iperf3 (apt-get install iperf3).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
SECONDS_EACH=4 ROUNDS=2 PLACES=lo,netns
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_EACH=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --places) PLACES=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "streams.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
command -v iperf3 >/dev/null || { echo "streams.sh: needs iperf3 (apt-get install iperf3)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/taiji-streams.XXXXXX)
HOSTS=4
CC=()
[ -n "${CONGESTION:-}" ] && CC=(-C "$CONGESTION")
SERVERS=()
cleanup() {
  local p
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null; done
  if [ "${CLUSTER_UP:-0}" = 1 ]; then timeout 60 bash "$CLUSTER" down >/dev/null 2>&1; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# in_place PLACE I CMD...: CMD on host I (loopback: here).
in_place() {
  local place=$1 i=$2
  shift 2
  if [ "$place" = netns ]; then ip netns exec tjn-h"$i" "$@"; else "$@"; fi
}
addr() { [ "$1" = netns ] && echo "10.251.0.$2" || echo 127.0.0.1; }
port() { [ "$1" = netns ] && echo 5201 || echo $((5300 + $2)); }

# ring PLACE P: one run of every rank sending to the next with P connections; prints the
# receivers' goodput in GB/s.
ring() {
  local place=$1 p=$2 i j pids=()
  for i in $(seq 1 $HOSTS); do
    j=$((i % HOSTS + 1))
    in_place "$place" "$i" timeout $((SECONDS_EACH + 30)) iperf3 -c "$(addr "$place" "$j")" \
      -p "$(port "$place" "$j")" -t "$SECONDS_EACH" -P "$p" "${CC[@]}" -J >"$OUT/ring.$i.json" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  python3 - "$OUT" $HOSTS <<'PY'
import json, sys
out, hosts = sys.argv[1], int(sys.argv[2])
rates = []
for i in range(1, hosts + 1):
    try:
        rates.append(json.load(open(f"{out}/ring.{i}.json"))["end"]["sum_received"]["bits_per_second"] / 8e9)
    except (OSError, ValueError, KeyError):
        rates.append(float("nan"))
print(" ".join(f"{r:.4f}" for r in rates))
PY
}

IFS=, read -r -a places <<<"$PLACES"
for place in "${places[@]}"; do
  case $place in
    lo) ;;
    netns)
      [ "$(id -u)" = 0 ] || { echo "streams.sh: skipping netns: needs root" >&2; continue; }
      if ip netns list | grep -q '^tjn-'; then
        echo "streams.sh: skipping netns: tjn-* namespaces exist already" >&2
        continue
      fi
      timeout 60 bash "$CLUSTER" up $HOSTS >/dev/null || { echo "streams.sh: netns-cluster up failed" >&2; exit 1; }
      CLUSTER_UP=1
      if [ -n "${NETNS_MTU:-}" ]; then
        for i in $(seq 1 $HOSTS); do
          ip -n tjn-sw link set p"$i" mtu "$NETNS_MTU" && ip -n tjn-h"$i" link set veth0 mtu "$NETNS_MTU"
        done
      fi
      ;;
    *) echo "streams.sh: unknown place $place (lo or netns)" >&2; exit 2 ;;
  esac
  for i in $(seq 1 $HOSTS); do
    in_place "$place" "$i" iperf3 -s -p "$(port "$place" "$i")" >/dev/null 2>&1 &
    SERVERS+=($!)
  done
  sleep 1
  mtu=
  [ "$place" = netns ] && mtu=${NETNS_MTU:-}
  echo "-- $place: $HOSTS ranks in a ring, $SECONDS_EACH s per run, $ROUNDS rounds${mtu:+, MTU $mtu}${CONGESTION:+, $CONGESTION}"
  for r in $(seq 1 "$ROUNDS"); do
    for p in 1 2 4; do echo "$p $(ring "$place" "$p")"; done
  done | tee "$OUT/$place.txt" | sed 's/^/   connections per pair, GB\/s per receiver: /'
  python3 - "$OUT/$place.txt" "$place" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p, *rates = line.split()
    rows.setdefault(int(p), []).extend(float(r) for r in rates)
base = statistics.median(rows[1])
for p in sorted(rows):
    m = statistics.median(rows[p])
    print(f"   {sys.argv[2]}: {p} connection(s) per pair: median {m:.3f} GB/s per receiver, {m / base:.2f}x one")
PY
  for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null; done
  SERVERS=()
  if [ "$place" = netns ]; then timeout 60 bash "$CLUSTER" down >/dev/null 2>&1; CLUSTER_UP=0; fi
done
