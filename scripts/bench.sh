#!/bin/bash
# The main job: 4 local peers running the allreduce benchmark through the launcher.
# Extra arguments go to taiji-bench (see build/bench/taiji-bench --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tools/taiji-run -np 4 build/bench/taiji-bench "$@"
