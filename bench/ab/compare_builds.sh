#!/bin/bash
# Usage: bench/ab/compare_builds.sh OLD_BUILD NEW_BUILD [ROUNDS]
#
# Times two builds of taiji (each a Meson build directory with tools/taiji-run and
# bench/taiji-bench) side by side: every round runs each case on the old build, then on
# the new one, so both see the same machine noise. Prints one Markdown table of the
# median times over ROUNDS (default 5) and the ratio new/old. The cases are those a
# change of the runtime's structure must leave alone: a 4 B allreduce at n = 2, the
# 4-peer barrier, and 1 MiB and 64 MiB allreduces at n = 4, each over shared memory and
# over TCP alone (TAIJI_SHM=off). Every result is checked by the benchmark itself.
set -euo pipefail
old=${1:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [ROUNDS]}
new=${2:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [ROUNDS]}
rounds=${3:-5}
scratch=$(mktemp -d /tmp/taiji-ab.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# name|peers|taiji-bench arguments
cases=(
  "allreduce 4 B|2|-b 4 -e 4 -n 20000"
  "barrier|4|--op barrier -n 2000"
  "allreduce 1 MiB|4|-b 1M -e 1M -n 200"
  "allreduce 64 MiB|4|-b 64M -e 64M -n 10 -w 2"
)

run_case() {  # run_case BUILD PEERS SHM ARGS... : prints the median time in us
  local build=$1 peers=$2 shm=$3
  shift 3
  local csv="$scratch/out.csv"
  rm -f "$csv"
  TAIJI_SHM=$shm timeout 300 "$build/tools/taiji-run" -np "$peers" "$build/bench/taiji-bench" \
    "$@" --csv "$csv" >"$scratch/log" 2>&1 || { cat "$scratch/log" >&2; return 1; }
  awk -F, 'NR == 2 { if ($15 != "ok" && $15 != "-") exit 1; print $10 }' "$csv"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A times
for ((r = 1; r <= rounds; r++)); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name peers args <<<"$c"
    for shm in auto off; do
      for side in old new; do
        build=$old
        [ "$side" = new ] && build=$new
        # shellcheck disable=SC2086
        t=$(run_case "$build" "$peers" "$shm" $args)
        times["$name|$shm|$side"]+="$t "
      done
    done
  done
  echo "round $r of $rounds done" >&2
done

echo "| case | peers | transport | old (us) | new (us) | new/old |"
echo "|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  IFS='|' read -r name peers args <<<"$c"
  for shm in auto off; do
    o=$(tr ' ' '\n' <<<"${times["$name|$shm|old"]}" | grep . | median)
    n=$(tr ' ' '\n' <<<"${times["$name|$shm|new"]}" | grep . | median)
    transport="shared memory"
    [ "$shm" = off ] && transport="TCP"
    awk -v name="$name" -v p="$peers" -v t="$transport" -v o="$o" -v n="$n" \
      'BEGIN { printf "| %s | %d | %s | %.2f | %.2f | %.3f |\n", name, p, t, o, n, n / o }'
  done
done
