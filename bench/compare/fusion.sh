#!/bin/bash
# The fusion case of bench/compare/run.sh: 100 named 4 KiB allreduces posted together,
# taiji with fusion on vs off (n=4, loopback). taiji only; runs only when taiji-bench has a
# fusion benchmark mode (--fusion-test, or --many with --fusion) and prints its output.
# Usage: bench/compare/fusion.sh BUILD OUT
set -uo pipefail
BUILD=$1 OUT=$2
RUN=$BUILD/tools/taiji-run
BENCH=$BUILD/bench/taiji-bench
note() { echo "fusion.sh: $*" | tee -a "$OUT/notes.txt" >&2; }
help=$("$BENCH" --help 2>&1)
if grep -q -- '--fusion-test' <<<"$help"; then
  args=(--fusion-test 100x4K)
elif grep -q -- '--many' <<<"$help" && grep -q -- '--fusion' <<<"$help"; then
  args=(--many 100 -b 4K -e 4K --fusion both)
else
  note "skipping the fusion case: this taiji-bench has no fusion mode (--fusion-test or --many/--fusion)"
  exit 0
fi
echo "-- fusion: taiji-bench ${args[*]} (n=4)"
log=$OUT/fusion.log
if timeout -k 10 600 "$RUN" -np 4 --timeout 570 "$BENCH" "${args[@]}" >"$log" 2>&1; then
  sed 's/^\[0\] //; /^\[[1-9][0-9]*\] /d' "$log" | tee "$OUT/fusion.txt"
else
  note "taiji-bench ${args[*]} failed; log: $log"
  tail -5 "$log" >&2
  exit 1
fi
