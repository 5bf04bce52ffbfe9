#!/bin/bash
# Rewrites capi/abi/libtaiji.abi, the baseline that the 'abi' test suite checks libtaiji.so
# against, from the library in ./build (or the build directory given):
#   scripts/abi-baseline.sh [BUILD-DIR]
# Run it only for an intended, compatible change (a new version node in capi/taiji.map, a
# member appended to a config struct), after the check accepted it, and commit the new
# baseline with that change. An incompatible change needs a new soname (major version)
# instead. The build needs debug information (debugoptimized, the default here); the
# baseline is abigail-tools 2.2's (Debian 12) reading of gcc's DWARF.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
meson compile -C "$dir" capi/taiji >/dev/null
python3 tests/abi/abi_check.py dump "$dir/capi/libtaiji.so" capi/abi/libtaiji.abi
echo "abi-baseline: wrote capi/abi/libtaiji.abi"
