#!/bin/bash
# Three ranks under taiji-run, fusion on rank 0 only (tests/consumer/mixed_fusion.c).
set -euo pipefail
run=$1 program=$2
out=$("$run" -np 3 --timeout 90 sh -c \
  'if [ "$TAIJI_RANK" = 0 ]; then export TAIJI_FUSION=on; else export TAIJI_FUSION=off; fi; exec "$0"' \
  "$program")
echo "$out"
for r in 0 1 2; do
  grep -qx "\[$r\] rank $r of 3 ok" <<<"$out" || { echo "rank $r did not report ok"; exit 1; }
done
