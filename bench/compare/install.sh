#!/bin/bash
# Installs what bench/compare/run.sh compares taiji with (Debian packages, as root): Gloo,
# Open MPI, PyTorch (its gloo backend), matplotlib for the plot and iperf3 (streams.sh);
# then reconfigures the build so that Meson builds the peer programs. The test suite needs
# none of this.
# Usage: bench/compare/install.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
packages=(libgloo-dev libopenmpi-dev openmpi-bin python3-torch python3-matplotlib time iperf3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (apt-get needs it) or install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ -f "$BUILD/build.ninja" ]; then
  meson setup --reconfigure "$BUILD" >/dev/null
else
  meson setup "$BUILD" --buildtype=debugoptimized >/dev/null
fi
ninja -C "$BUILD" tools/taiji-run bench/taiji-bench >/dev/null
for t in taiji-compare-gloo taiji-compare-mpi; do
  if grep -q "bench/compare/$t:" "$BUILD/build.ninja"; then
    ninja -C "$BUILD" "bench/compare/$t" >/dev/null
  else
    echo "install.sh: Meson did not find the library for $t; see $BUILD/meson-logs/meson-log.txt" >&2
  fi
done
echo "install.sh: peers built in $BUILD/bench/compare; run bench/compare/run.sh --quick"
