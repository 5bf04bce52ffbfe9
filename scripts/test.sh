#!/bin/bash
# Sets up and builds (scripts/setup.sh), runs the whole test suite, then the sanitizer
# passes (scripts/sanitize.sh: the whole suite under ASan + UBSan, the multi-peer, process
# and monitor tests under TSan), with the Python package's tests (pytest) after the plain
# pass, and ends with one line "N passed, N failed" counted from Meson's test logs and
# pytest's report. Arguments go to every pass's `meson test`.
#
# TAIJI_SANITIZE picks the sanitizer passes: "asan,tsan", "asan", "tsan" or "none".
# Unset, CI runs both and a local run none (they take most of 20 minutes on 2 cores).
set -uo pipefail
cd "$(dirname "$0")/.."

case ${CI:-} in
  "" | 0 | false | no) default=none ;;
  *) default=asan,tsan ;;
esac
IFS=', ' read -r -a sanitizers <<<"${TAIJI_SANITIZE:-$default}"

status=0
logs=()
run_pass() {  # run_pass NAME BUILD-DIR COMMAND...: runs one pass, remembers its test log
  local name=$1 dir=$2 t0 rc=0
  shift 2
  local log=$dir/meson-logs/testlog.json
  [ "$name" = python ] && log=$dir/pytest.xml
  t0=$(date +%s)
  rm -f "$log"
  "$@" || rc=$?
  [ $rc = 0 ] || status=1
  echo "test: $name pass took $(($(date +%s) - t0)) s"
  logs+=("$name=$rc=$log")
}

plain() {
  local t0
  t0=$(date +%s)
  scripts/setup.sh || return 1
  echo "test: plain: built in $(($(date +%s) - t0)) s"
  meson test -C build --print-errorlogs --num-processes 1 "$@"
}
run_pass plain build plain "$@"
# The Python package's tests, against the plain build's library and launcher.
python_tests() {
  [ -f build/build.ninja ] || return 1
  TAIJI_LIBRARY="$PWD/build/capi/libtaiji.so" PATH="$PWD/build/tools:$PATH" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml=build/pytest.xml python/tests
}
run_pass python build python_tests
for s in "${sanitizers[@]}"; do
  case $s in
    none) ;;
    asan | tsan) run_pass "$s" "build-$s" scripts/sanitize.sh "$s" "$@" ;;
    *)
      echo "test: unknown sanitizer '$s' in TAIJI_SANITIZE (asan, tsan or none)" >&2
      logs+=("$s=1=/nonexistent")
      status=1
      ;;
  esac
done

# A failed pass without a test log did not get as far as its tests (set-up or build
# failed): it counts as one failure.
python3 - "${logs[@]}" <<'PY'
import json, sys
passed = failed = skipped = 0
for arg in sys.argv[1:]:
    name, rc, path = arg.split("=", 2)
    try:
        lines = open(path).read().splitlines()
    except OSError:
        if rc != "0":
            print(f"FAILED {name}: set-up or build")
            failed += 1
        continue
    if path.endswith(".xml"):
        # pytest's JUnit report: a case with <failure> or <error> failed, <skipped> skipped.
        import xml.etree.ElementTree as ET
        for case in ET.parse(path).iter("testcase"):
            kinds = {child.tag for child in case}
            test = f"{case.get('classname', '')}::{case.get('name', '?')}"
            if kinds & {"failure", "error"}:
                failed += 1
                print(f"FAILED {name}: {test}")
            elif "skipped" in kinds:
                skipped += 1
            else:
                passed += 1
        continue
    for line in filter(None, map(str.strip, lines)):
        test = json.loads(line)
        result = test.get("result", "")
        if result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
            print(f"FAILED {name}: {test.get('name', '?')} ({result})")
if skipped:
    print(f"{skipped} skipped (their reasons are in the test logs)")
# The last line, exactly this form: CI reads it.
print(f"{passed} passed, {failed} failed")
PY
exit $status
