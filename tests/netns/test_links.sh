#!/bin/bash
# Link measurement across emulated hosts: three namespaces from netns-cluster with
# 200 Mbit/s links, the path from host 1 to host 2 (rank 0 to rank 1) throttled to
# 20 Mbit/s. The measured matrix must show that path, and only it, slow, and the other
# links near their rate. Skips (77) without root, working `ip netns` or the cluster script.
# Usage: test_links.sh taiji-run taiji-links-bench path/to/netns-cluster
set -u
RUN=$1 BENCH=$2 CLUSTER=$3
HOSTS=10.251.0.1:1,10.251.0.2:1,10.251.0.3:1
PORT=29410

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "no ip (iproute2)"
[ -r "$CLUSTER" ] || skip "no netns-cluster at $CLUSTER"
timeout 10 ip netns add tjn-probe 2>/dev/null || skip "ip netns add fails here"
timeout 10 ip netns del tjn-probe

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null; done
  timeout 60 bash "$CLUSTER" down >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

RATE=200mbit timeout 60 bash "$CLUSTER" up 3 >/dev/null || fail "netns-cluster up 3 failed"
RATE=200mbit timeout 30 bash "$CLUSTER" throttle 1 2 20mbit || fail "throttle failed"

rc=0
for h in 1 2 3; do
  timeout -k 5 150 ip netns exec tjn-h$h "$RUN" --hosts $HOSTS --self 10.251.0.$h --port $PORT \
    --job-id "links-$$" --timeout 120 "$BENCH" --sweep --bytes 262144 --iters 1 --warmup 0 \
    --probe-bytes 1048576 >"$TMP/out.$h" 2>&1 </dev/null &
  PIDS+=($!)
done
for h in 1 2 3; do wait "${PIDS[$((h - 1))]}" || rc=$?; done
PIDS=()
cat "$TMP/out.1"
[ $rc = 0 ] || { cat "$TMP/out.2" "$TMP/out.3"; fail "a launcher exited with $rc"; }

# The matrix rows, "[0] #   S:  bw(S->0) bw(S->1) bw(S->2)" in MB/s.
rows=$(grep -E '^\[0\] # +[0-9]+:' "$TMP/out.1" | sed -E 's/^\[0\] # +[0-9]+://')
[ "$(echo "$rows" | wc -l)" = 3 ] || fail "no 3-row matrix in rank 0's output"
echo "$rows" | awk '
  { for (d = 1; d <= 3; ++d) bw[NR - 1, d - 1] = $d }
  END {
    slow = bw[0, 1]
    if (!(slow > 0 && slow < 5)) { print "FAIL: 0->1 measured " slow " MB/s, want under 5 (20 Mbit/s)"; exit 1 }
    for (s = 0; s < 3; ++s) for (d = 0; d < 3; ++d) {
      if (s == d || (s == 0 && d == 1)) continue
      if (!(bw[s, d] > 12 && bw[s, d] < 40)) { print "FAIL: " s "->" d " measured " bw[s, d] " MB/s, want near 25 (200 Mbit/s)"; exit 1 }
    }
    print "ok: 0->1 at " slow " MB/s, every other link near 25 MB/s"
  }' || fail "implausible matrix"
