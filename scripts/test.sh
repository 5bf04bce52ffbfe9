#!/bin/bash
# Sets up and builds (scripts/setup.sh), runs the whole test suite, and ends with one
# line "N passed, N failed" counted from Meson's test log.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
meson test -C build --print-errorlogs --num-processes 1 "$@"
status=$?
python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = skipped = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    result = json.loads(line).get("result", "")
    if result in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif result == "SKIP":
        skipped += 1
    else:
        failed += 1
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
PY
exit $status
