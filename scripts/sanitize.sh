#!/bin/bash
# Builds and runs tests under a sanitizer, each pass in its own build directory:
#   scripts/sanitize.sh asan [MESON-TEST-ARGS...]  every test under ASan + UBSan (build-asan)
#   scripts/sanitize.sh tsan [MESON-TEST-ARGS...]  the multi-peer, process, monitor and device tests
#                                                 under TSan (build-tsan)
# Only what the selected tests run is built. Every finding is fatal: the process stops at
# the first report, so its test fails. Meson's test log ends up in
# build-<pass>/meson-logs/testlog.json. Exit status: that of meson test, or 1 if the pass
# could not be configured or built.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pass=${1:?usage: scripts/sanitize.sh asan|tsan [meson test args...]}
shift
dir=build-$pass

# -O1 and line tables only (-g1): about half the compile time of -O2 -g (Catch2's main is
# the slowest file by far under ASan), still fast enough to run, and every frame of a report
# still has its file:line. -fno-sanitize-recover makes UBSan abort instead of printing and
# going on; float-cast-overflow (an out-of-range float to integer conversion, as a reduce
# kernel might do) is undefined behaviour that -fsanitize=undefined leaves out. gcc's
# -Wmaybe-uninitialized gives false positives in Catch2's main once ASan instruments it;
# werror stays on for everything else. b_lundef=false: sanitized shared libraries leave the
# sanitizer runtime's symbols to the executable.
common=(-Doptimization=1 -Ddebug=true -Db_lundef=false)
# Tests that cannot pass under a sanitizer for reasons that are not findings, each until
# the test learns to allow for it; the plain pass still runs them.
# install-pkgconfig builds the C consumer with plain `cc` against the installed library,
# and a sanitized library needs the sanitizer runtime in the executable.
# fault-sigstop-large-rank2 checks that every op after a SIGSTOP times out on its own
# deadline; ASan's slowdown spreads the posts so far apart that the first timeout's link cut
# turns the later ones into PEER_LOST (right, but not what that test's timing checks).
skip="install-pkgconfig"
[ "$pass" = asan ] && skip="$skip fault-sigstop-large-rank2"
# The launcher is single-threaded: TSan has nothing to find in it, and the ranks it starts
# run the library the multi-peer tests race already.
[ "$pass" = tsan ] && skip="$skip launcher"
skip_suites=""
# The multi-peer sweeps over world sizes stop at 3-5 peers (tests/multipeer/common.h):
# the sanitizers slow them 3-10x, and what they find does not depend on the larger sizes,
# which the plain pass runs. The fault tests read it too, to widen their promptness bounds.
export TAIJI_TEST_QUICK=1
case $pass in
  asan)
    flags="'-g1', '-fno-omit-frame-pointer', '-fsanitize=float-cast-overflow', '-fno-sanitize-recover=all'"
    setup=("${common[@]}" -Db_sanitize=address,undefined
      "-Dc_args=[$flags]" "-Dcpp_args=[$flags, '-Wno-maybe-uninitialized']")
    suites=""  # every suite
    # The wire tests bound resident memory, and ASan keeps freed memory in quarantine (up
    # to 256 MiB), so resident memory grows whatever the code does.
    skip_suites="wire"
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_init_order=1:check_initialization_order=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    ;;
  tsan)
    flags="'-g1', '-fno-omit-frame-pointer'"
    setup=("${common[@]}" -Db_sanitize=thread "-Dc_args=[$flags]" "-Dcpp_args=[$flags]")
    # The suites with threads to race. The wire suite bounds resident memory, which TSan's
    # own bookkeeping grows; the fault suite's deadlines do not allow TSan's slowdown.
    suites="multipeer process monitor device"
    # Slower still than ASan: the sweeps stop at 3 peers (the ASan pass goes to 4).
    export TAIJI_TEST_MAX_PEERS=3
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp
    ;;
  *)
    echo "sanitize: unknown pass '$pass' (asan or tsan)" >&2
    exit 2
    ;;
esac

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed() { tail -n 60 "$log" >&2; echo "sanitize: $pass: $1 failed" >&2; exit 1; }

t0=$(date +%s)
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${setup[@]}" >"$log" 2>&1 || failed "meson setup"
fi
# Reconfigures if a meson.build changed since, so that the introspection below is current.
ninja -C "$dir" build.ninja >"$log" 2>&1 || failed "meson reconfigure"

# The tests of $suites (all when empty) less $skip and $skip_suites, and the files they
# need built: each test's program and the targets it depends on.
selection=$(python3 - "$dir" "$suites" "$skip" "$skip_suites" <<'PY'
import json, os, subprocess, sys
build, suites, skip, skip_suites = sys.argv[1], *(a.split() for a in sys.argv[2:])
def introspect(what):
    return json.loads(subprocess.check_output(["meson", "introspect", build, what]))
files = {t["id"]: t["filename"] for t in introspect("--targets")}
build = os.path.realpath(build)
needed = set()
for test in introspect("--tests"):
    test_suites = [s.split(":")[-1] for s in test["suite"]]
    if suites and not any(s in suites for s in test_suites):
        continue
    if test["name"] in skip or any(s in skip_suites for s in test_suites):
        continue
    print("test", test["name"])
    for target in test["depends"]:
        needed.update(os.path.relpath(f, build) for f in files.get(target, []))
for f in sorted(needed):
    print("file", f)
PY
) || failed "listing the tests"
mapfile -t tests < <(sed -n 's/^test //p' <<<"$selection")
mapfile -t targets < <(sed -n 's/^file //p' <<<"$selection")
if [ ${#tests[@]} = 0 ]; then
  echo "sanitize: $pass: no tests selected"
  exit 0
fi
ninja -C "$dir" -j2 "${targets[@]}" >"$log" 2>&1 || failed "build"
t1=$(date +%s)
echo "sanitize: $pass: built ${#targets[@]} targets for ${#tests[@]} tests in $((t1 - t0)) s"

meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 1 \
  --timeout-multiplier 3 "${tests[@]}" "$@"
status=$?
echo "sanitize: $pass: tests ran in $(($(date +%s) - t1)) s"
exit $status
