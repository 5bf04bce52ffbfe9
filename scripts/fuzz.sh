#!/bin/bash
# Usage: scripts/fuzz.sh TARGET|all SECONDS
#
# Builds the libFuzzer targets (fuzz/meson.build) with clang into ./build-fuzz, installing
# clang with apt-get when it is missing, then fuzzes TARGET (or each target in turn) for
# SECONDS on a scratch copy of fuzz/corpus/TARGET. Inputs that add coverage are merged back
# into fuzz/corpus/TARGET (-merge=1). Exits non-zero when a target crashes, leaks, times out
# or runs out of memory, and prints the reproducer's path.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: scripts/fuzz.sh TARGET|all SECONDS   (targets: ${targets[*]})" >&2
  exit 2
}

mapfile -t targets < <(sed -n "/^fuzz_targets = \[/,/^\]/s/^ *'\([A-Za-z0-9_]*\)',\{0,1\} *$/\1/p" \
  fuzz/meson.build)
[ $# -eq 2 ] || usage
[[ "$2" =~ ^[1-9][0-9]*$ ]] || usage
seconds=$2
if [ "$1" = all ]; then
  selected=("${targets[@]}")
else
  [[ " ${targets[*]} " == *" $1 "* ]] || usage
  selected=("$1")
fi

# libFuzzer ships in libclang-rt-*-dev, which Debian's clang package recommends.
if ! command -v clang++ >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fuzz: clang++ is missing; run as root (apt-get needs it) or install clang" >&2
    exit 1
  fi
  echo "fuzz: installing clang"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null
fi

# Coverage instrumentation and the sanitizers go into every library the targets link, so
# the fuzzer sees branches inside the parsers, not just in the target files. Shared
# libraries may not link the sanitizer runtime themselves, hence b_lundef=false. Clang
# flags an unused lambda capture in tcp_transport.cpp that gcc accepts; it stays a warning
# here so that the parsers can be fuzzed meanwhile.
if [ ! -f build-fuzz/build.ninja ]; then
  setup_log=$(mktemp /tmp/taiji-fuzz-setup.XXXXXX)
  CC=clang CXX=clang++ meson setup build-fuzz -Dfuzzing=true \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fsanitize=fuzzer-no-link \
    "-Dcpp_args=['-fsanitize=fuzzer-no-link', '-Wno-error=unused-lambda-capture']" \
    >"$setup_log" 2>&1 || { cat "$setup_log" >&2; rm -rf build-fuzz; exit 1; }
  rm -f "$setup_log"
fi
ninja -C build-fuzz -j2 "${selected[@]/#/fuzz/fuzz-}" >build-fuzz/ninja.log 2>&1 || {
  cat build-fuzz/ninja.log >&2
  exit 1
}

# UBSan only reports by default; halting turns a report into a crash libFuzzer records.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
failed=0
for t in "${selected[@]}"; do
  scratch=$(mktemp -d "/tmp/taiji-fuzz-$t.XXXXXX")
  mkdir -p "$scratch/corpus" "$scratch/artifacts"
  cp fuzz/corpus/"$t"/* "$scratch/corpus/"
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=("-dict=fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (log: $scratch/fuzz.log)"
  status=0
  timeout --kill-after=30 $((seconds + 300)) "build-fuzz/fuzz/fuzz-$t" \
    -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$scratch/artifacts/" "${dict[@]}" "$scratch/corpus" \
    >"$scratch/fuzz.log" 2>&1 || status=$?
  grep -E '^stat::number_of_executed_units|^#[0-9]+ +DONE' "$scratch/fuzz.log" || true
  # Slow-unit reports are artifacts too, but not failures.
  reproducers=("$scratch"/artifacts/{crash,leak,timeout,oom}-*)
  reproducers=($(ls -d "${reproducers[@]}" 2>/dev/null || true))
  if [ "$status" -ne 0 ] || [ ${#reproducers[@]} -gt 0 ]; then
    grep -E '^==[0-9]+==ERROR|SUMMARY|^fuzz_|runtime error' "$scratch/fuzz.log" | head -5 || true
    echo "fuzz: $t FAILED (exit $status); reproducer: ${reproducers[*]}" >&2
    echo "fuzz: replay it with build-fuzz/fuzz/fuzz-$t ${reproducers[0]}" >&2
    failed=1
    continue
  fi
  # Without hit counters a merged input must reach new code, not just run a loop a new
  # number of times: that keeps the checked-in corpus at tens of files.
  before=$(find "fuzz/corpus/$t" -type f | wc -l)
  timeout --kill-after=30 600 "build-fuzz/fuzz/fuzz-$t" -merge=1 -use_counters=0 -timeout=25 \
    -rss_limit_mb=2048 "fuzz/corpus/$t" "$scratch/corpus" >"$scratch/merge.log" 2>&1 || {
    echo "fuzz: $t: merging failed, see $scratch/merge.log" >&2
    failed=1
    continue
  }
  after=$(find "fuzz/corpus/$t" -type f | wc -l)
  echo "fuzz: $t passed; $((after - before)) new inputs merged into fuzz/corpus/$t"
  rm -rf "$scratch"
done
exit $failed
