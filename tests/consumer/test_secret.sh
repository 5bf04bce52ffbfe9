#!/bin/bash
# Job secrets end to end with real processes: a job whose ranks share a secret runs; a rank
# with another secret, or with none, cannot join (TAIJI_ERR_AUTH with the reason on the rank
# that dials);
# a secret file readable by others is refused (TAIJI_ERR_CONFIG); taiji-run --secret works.
set -uo pipefail
taiji_run=$1
consumer=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; for f in "$work"/out.*; do [ -f "$f" ] && { echo "--- $f"; head -n 20 "$f"; }; done; exit 1; }

printf 'first job secret, 32 bytes long.' > "$work/a"
printf 'other job secret, 32 bytes long.' > "$work/b"
chmod 600 "$work/a" "$work/b"

# run_ranks SECRET0 SECRET1 SECRET2: three ranks, each with its own TAIJI_SECRET_FILE (or none
# for "-"); leaves each rank's exit code in $work/rc.<r> and output in $work/out.<r>. The
# deadlines are $init_ms and $handshake_ms: long for a job that must start (three
# sanitized processes on two cores start slowly), shorter where ranks must fail, since the
# ranks that were not refused wait out their init deadline.
init_ms=30000
handshake_ms=10000
run_ranks() {
  local port pids=() r=0
  port=$(python3 "$(dirname "$0")/../support/free_port.py")
  rm -f "$work"/out.* "$work"/rc.*
  for secret in "$@"; do
    local extra=()
    [ "$secret" != - ] && extra=(TAIJI_SECRET_FILE="$secret")
    env -i PATH="$PATH" TAIJI_RANK=$r TAIJI_WORLD_SIZE=3 TAIJI_RENDEZVOUS=127.0.0.1:$port \
      TAIJI_JOB_ID=sec$port TAIJI_INIT_TIMEOUT_MS=$init_ms TAIJI_HANDSHAKE_TIMEOUT_MS=$handshake_ms \
      "${extra[@]}" timeout 60 "$consumer" >"$work/out.$r" 2>&1 &
    pids+=($!)
    r=$((r + 1))
  done
  for r in 0 1 2; do
    wait "${pids[$r]}"
    echo $? > "$work/rc.$r"
  done
}

run_ranks "$work/a" "$work/a" "$work/a"
for r in 0 1 2; do
  [ "$(cat "$work/rc.$r")" = 0 ] && grep -qx "rank $r of 3 ok" "$work/out.$r" || fail "shared secret: rank $r"
done
echo "ok: ranks sharing a secret run"

# The ranks left waiting for the refused one wait out this deadline: long enough for
# three sanitized processes to start on two cores and refuse it, short enough not to wait long.
init_ms=4000
handshake_ms=3000

# Rank 2 dials ranks 0 and 1; with a different secret it must be refused by the MAC check.
run_ranks "$work/a" "$work/a" "$work/b"
[ "$(cat "$work/rc.2")" != 0 ] || fail "wrong secret: rank 2 joined"
grep -q "init: TAIJI_ERR_AUTH: .*failed authentication" "$work/out.2" || fail "wrong secret: no AUTH error on rank 2"
for r in 0 1; do
  [ "$(cat "$work/rc.$r")" != 0 ] || fail "wrong secret: rank $r completed a job with an intruder"
done
echo "ok: a rank with another secret cannot join"

run_ranks "$work/a" "$work/a" -
[ "$(cat "$work/rc.2")" != 0 ] || fail "no secret: rank 2 joined"
# The ranks holding the secret refuse it and tell it why: AUTH and the reason, on the side
# that must fix its configuration.
grep -q "init: TAIJI_ERR_AUTH: .*refused the connection: its job has a secret and this peer has none" "$work/out.2" ||
  fail "no secret: rank 2 is not told it lacks the secret"
grep -q "Hello from rank 2 offers no authentication, but this job has a secret" "$work/out.0" ||
  fail "no secret: rank 0 does not say why it refused rank 2"
echo "ok: a rank without the secret cannot join"

chmod 640 "$work/b"
run_ranks "$work/b" "$work/b" "$work/b"
for r in 0 1 2; do
  grep -q "init: TAIJI_ERR_CONFIG: .*has mode 0640: a job secret must not be readable by group or others" \
    "$work/out.$r" || fail "group-readable secret accepted by rank $r"
done
echo "ok: a group-readable secret file is refused"

out=$(timeout 60 "$taiji_run" -np 3 --secret "$consumer" 2>&1) || { echo "$out"; fail "taiji-run --secret"; }
for r in 0 1 2; do echo "$out" | grep -qx "\[$r\] rank $r of 3 ok" || { echo "$out"; fail "taiji-run --secret: rank $r"; }; done
left=$(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'taiji-secret-*' -newer "$work/a" 2>/dev/null | wc -l)
[ "$left" = 0 ] || fail "taiji-run left its secret file behind"
echo "ok: taiji-run --secret"
