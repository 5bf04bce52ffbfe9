#!/bin/bash
# Runs the C consumer as 3 processes under taiji-run; every rank must report ok.
set -euo pipefail
run=$1 consumer=$2
out=$("$run" -np 3 --timeout 60 "$consumer")
echo "$out"
for r in 0 1 2; do
  grep -qx "\[$r\] rank $r of 3 ok" <<<"$out" || { echo "rank $r did not report ok"; exit 1; }
done
