# What the launcher tests share; sourced after TMP is set. fail prints the files named in
# FAIL_FILES (default: $TMP/out and $TMP/err) before it exits.

ok() { echo "ok - $1"; }
fail() {
  echo "FAIL - $1" >&2
  local f
  for f in ${FAIL_FILES:-"$TMP/out $TMP/err"}; do
    if [ -s "$f" ]; then echo "--- $(basename "$f"):" >&2; cat "$f" >&2; fi
  done
  exit 1
}

# wait_for SECONDS COMMAND...: true once COMMAND succeeds, false if it never does in time.
wait_for() {
  local tenths=$(($1 * 10)) i
  shift
  for ((i = 0; i < tenths; i++)); do
    "$@" && return 0
    sleep 0.1
  done
  return 1
}

# wait_bounded PID SECONDS: waits for a background job; sets RC (255: still running, killed).
wait_bounded() {
  local pid=$1 tenths=$(($2 * 10)) i
  for ((i = 0; i < tenths; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      RC=0
      wait "$pid" || RC=$?
      return 0
    fi
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" || true
  RC=255
}

# store get|set KEY [VALUE]: the store at $ADDR, through $TOOL (store_tool.py).
store() { timeout -s KILL 10 python3 "$TOOL" "$ADDR" "$@"; }
