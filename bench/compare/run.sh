#!/bin/bash
# taiji side by side with Gloo, Open MPI and PyTorch (torch.distributed, gloo backend): the
# same sizes, process counts and placement, f32, every result checked, one run, one table.
#
# Usage: bench/compare/run.sh [--quick] [--cases LIST] [--build DIR] [--out DIR]
#   --quick       fewer sizes and iterations (about 2 minutes)
#   --cases LIST  comma-separated, default all that apply:
#     tcp      n=4 allreduce 1..64 MiB over loopback TCP: taiji (TAIJI_SHM=off), Gloo (best
#              of its algorithms), MPI (btl tcp), torch
#     shm      n=2 and n=4 allreduce 1..64 MiB: taiji as it chooses vs MPI shared memory
#              (btl vader)
#     latency  n=2 allreduce 4 B (taiji, MPI tcp, Gloo, torch), n=4 barrier (the same);
#              taiji as it chooses (shared memory between local peers), and again in
#              the rows "lattcp" with TAIJI_SHM=off against the same MPI over TCP
#     fusion   100 x 4 KiB named allreduces posted together, taiji fusion on vs off (only
#              when taiji-bench has such a mode)
#     netns    4 emulated hosts at RATE (1gbit) from ../shared/tools/netns-cluster: allreduce
#              16 and 64 MiB, broadcast 64 MiB; taiji, Gloo, MPI (needs root)
#   --repeat R    run all cases R times, one round after the other (default 1); the table
#                 gives each implementation's median over the rounds
#   --build DIR   taiji build directory (default build)
#   --out DIR     where the logs and results go (default: a new directory under /tmp)
# Writes OUT/results.jsonl (every row), OUT/table.csv and OUT/table.json, OUT/busbw.png (or
# .svg), and prints the table. A missing peer is reported and its column left out
# (bench/compare/install.sh installs them). Exit status 1 if any result was wrong.
#
# CPU cost is measured the same way for every implementation: user+sys CPU seconds of the
# timed loop, summed over ranks. The peers read getrusage(RUSAGE_SELF) around the loop;
# taiji-bench is run twice per size under /usr/bin/time (which sees every rank through
# taiji-run), once with ITERS iterations and once with 1, and the difference is divided
# by ITERS - 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/compare
BUILD=build QUICK=0 REPEAT=1 CASES=tcp,shm,latency,fusion,netns OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --repeat) REPEAT=$2; shift ;;
    --cases) CASES=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $BUILD = /* ]] || BUILD=$ROOT/$BUILD
OUT=${OUT:-$(mktemp -d /tmp/taiji-compare.XXXXXX)}
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: >"$RES"
PY=/usr/bin/python3   # Debian's python3-torch and python3-matplotlib live here
RUN=$BUILD/tools/taiji-run
BENCH=$BUILD/bench/taiji-bench
GLOO=$BUILD/bench/compare/taiji-compare-gloo
MPI=$BUILD/bench/compare/taiji-compare-mpi
TORCH=$HERE/torch_peer.py
CLUSTER=${NETNS_CLUSTER:-$ROOT/../shared/tools/netns-cluster}
export RATE=${RATE:-1gbit}
JOB_TIMEOUT=${JOB_TIMEOUT:-600}
# ob1 makes --mca btl choose the transport; on one host TCP goes over lo.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl_tcp_if_include lo)

die() { echo "run.sh: $*" >&2; exit 2; }
note() { echo "run.sh: $*" | tee -a "$OUT/notes.txt" >&2; }
has_case() { [[ ,$CASES, = *,$1,* ]]; }
[ -x "$RUN" ] && [ -x "$BENCH" ] || die "no $RUN or $BENCH; build first: meson setup build && ninja -C build"
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "--repeat takes a positive number"
[ -x /usr/bin/time ] || die "needs /usr/bin/time (apt-get install time)"

# Which peers are there; a missing one loses its column, with the reason.
HAVE_GLOO=0 HAVE_MPI=0 HAVE_TORCH=0
if [ -x "$GLOO" ]; then HAVE_GLOO=1; else
  note "no Gloo peer ($GLOO): skipping the Gloo column; run bench/compare/install.sh (libgloo-dev), then ninja -C $BUILD"
fi
if [ -x "$MPI" ] && command -v mpirun >/dev/null; then HAVE_MPI=1; else
  note "no Open MPI peer ($MPI) or no mpirun: skipping the MPI column; run bench/compare/install.sh (libopenmpi-dev openmpi-bin), then ninja -C $BUILD"
fi
if [ -x $PY ] && $PY -c 'import torch.distributed' 2>/dev/null; then HAVE_TORCH=1; else
  note "no PyTorch for $PY: skipping the torch column; run bench/compare/install.sh (python3-torch)"
fi

# Iterations per size, the same for every implementation (peers compute it from these
# flags themselves): ceil(ITER_BYTES / size) within [MIN_ITERS, MAX_ITERS].
if [ $QUICK = 1 ]; then
  BIG_SIZES="1M 4M 16M" SHM_SIZES="1M 16M" ITER_BYTES=128M MIN_ITERS=5 MAX_ITERS=100
  LAT_ITERS=200 NETNS_ALLREDUCE="16M" NETNS_BROADCAST="" NETNS_ITERS=2
else
  BIG_SIZES="1M 2M 4M 8M 16M 32M 64M" SHM_SIZES="1M 4M 16M 64M" ITER_BYTES=512M
  MIN_ITERS=5 MAX_ITERS=200 LAT_ITERS=1000 NETNS_ALLREDUCE="16M 64M" NETNS_BROADCAST="64M"
  NETNS_ITERS=3
fi
WARMUP=2

bytes_of() { numfmt --from=iec "$1"; }
iters_for() {  # iters_for SIZE
  local b i
  b=$(bytes_of "$1")
  i=$(( ($(bytes_of $ITER_BYTES) + b - 1) / b ))
  [ $i -lt $MIN_ITERS ] && i=$MIN_ITERS
  [ $i -gt $MAX_ITERS ] && i=$MAX_ITERS
  echo $i
}

LOGN=0
next_log() { LOGN=$((LOGN + 1)); LOG="$OUT/$(printf %03d $LOGN)-$1.log"; }
FAILED=0
failed() { FAILED=1; note "$1 failed (exit $2); log: $3"; tail -5 "$3" >&2; }

# taiji CASE NP ITERS BENCH-ARGS...: two runs (ITERS and 1 iteration) for the CPU difference.
taiji() {
  local case=$1 np=$2 iters=$3; shift 3
  local cpu=() n log json=
  for n in "$iters" 1; do
    next_log "taiji-$case-$n"; log=$LOG
    json=${json:-$log.json}
    if ! /usr/bin/time -f '%U %S' -o "$log.time" timeout -k 10 $((JOB_TIMEOUT + 30)) \
        "$RUN" -np "$np" --timeout "$JOB_TIMEOUT" "$BENCH" "$@" --iters "$n" --warmup $WARMUP \
        --json "$log.json" >"$log" 2>&1; then
      failed "taiji $case $*" $? "$log"; return
    fi
    cpu+=("$(awk 'END { print $1 + $2 }' "$log.time")")
  done
  $PY "$HERE/results.py" taiji "$case" "$json" "${cpu[0]}" "${cpu[1]}" "$iters" >>"$RES"
}

# Peers take the same size and iteration flags.
peer_flags() {  # peer_flags SIZE [ITERS]
  echo "-b $1 -e $1 --warmup $WARMUP --iter-bytes $ITER_BYTES --min-iters $MIN_ITERS" \
    "--max-iters $MAX_ITERS ${2:+--iters $2}"
}

# mpi CASE NP BTL OP SIZE [ITERS]
mpi() {
  [ $HAVE_MPI = 1 ] || return 0
  local case=$1 np=$2 btl=$3 op=$4 size=$5 iters=${6:-} log
  next_log "mpi-$case"; log=$LOG
  if timeout -k 10 "$JOB_TIMEOUT" "${MPIRUN[@]}" -np "$np" --mca btl "$btl" "$MPI" --op "$op" \
      $(peer_flags "$size" "$iters") >"$log" 2>&1; then
    $PY "$HERE/results.py" tag "$case" <"$log" >>"$RES"
  else
    failed "mpi $case $op $size" $? "$log"
  fi
}

# ranks CASE NAME NP STORE CMD...: NP local ranks of a peer that takes --rank/--world/--store;
# STORE: "dir" (Gloo's file store) or "file" (torch's file:// rendezvous).
ranks() {
  local case=$1 name=$2 np=$3 kind=$4; shift 4
  local store pids=() r rc=0 log
  store=$(mktemp -d "$OUT/store.XXXXXX")
  [ "$kind" = file ] && store=$store/rdv
  next_log "$name-$case"; log=$LOG
  for r in $(seq 0 $((np - 1))); do
    GLOO_SOCKET_IFNAME=lo timeout -k 10 "$JOB_TIMEOUT" "$@" --rank "$r" --world "$np" \
      --store "$store" >"$log.$r" 2>&1 </dev/null &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=$?; done
  cat "$log".* >"$log"
  # Rows of a run that failed still count: a wrong result is a FAIL row (left out of the
  # table, listed under it), and the other algorithms' rows stay valid.
  $PY "$HERE/results.py" tag "$case" <"$log.0" >>"$RES"
  [ $rc = 0 ] || failed "$name $case" $rc "$log"
}
gloo() {  # gloo CASE NP OP SIZE [ITERS]
  [ $HAVE_GLOO = 1 ] || return 0
  ranks "$1" gloo "$2" dir "$GLOO" --op "$3" $(peer_flags "$4" "${5:-}")
}
torch() {  # torch CASE NP OP SIZE [ITERS]
  [ $HAVE_TORCH = 1 ] || return 0
  ranks "$1" torch "$2" file $PY "$TORCH" --op "$3" $(peer_flags "$4" "${5:-}")
}

echo "== taiji $(git -C "$ROOT" describe --always --dirty 2>/dev/null) vs Gloo, Open MPI, torch; $(nproc) cores; logs in $OUT"
start=$SECONDS

# Sizes interleave implementations, so drift in machine load hits all of them alike.
for round in $(seq 1 "$REPEAT"); do
  [ "$REPEAT" = 1 ] || echo "== round $round of $REPEAT"
  if has_case tcp; then
    echo "-- tcp: n=4 allreduce over loopback TCP ($BIG_SIZES)"
    for s in $BIG_SIZES; do
      TAIJI_SHM=off taiji tcp 4 "$(iters_for "$s")" --op allreduce -b "$s" -e "$s"
      gloo tcp 4 allreduce "$s"
      mpi tcp 4 tcp,self allreduce "$s"
      torch tcp 4 allreduce "$s"
    done
  fi
  if has_case shm; then
    for np in 2 4; do
      echo "-- shm: n=$np allreduce, taiji default vs MPI vader ($SHM_SIZES)"
      for s in $SHM_SIZES; do
        taiji shm$np "$np" "$(iters_for "$s")" --op allreduce -b "$s" -e "$s"
        mpi shm$np "$np" vader,self allreduce "$s"
      done
    done
  fi
  if has_case latency; then
    echo "-- latency: n=2 allreduce 4 B, n=4 barrier ($LAT_ITERS iterations)"
    taiji lat 2 "$LAT_ITERS" --op allreduce -b 4 -e 4
    gloo lat 2 allreduce 4 "$LAT_ITERS"
    mpi lat 2 tcp,self allreduce 4 "$LAT_ITERS"
    torch lat 2 allreduce 4 "$LAT_ITERS"
    taiji lat 4 "$LAT_ITERS" --op barrier
    gloo lat 4 barrier 4 "$LAT_ITERS"
    mpi lat 4 tcp,self barrier 4 "$LAT_ITERS"
    torch lat 4 barrier 4 "$LAT_ITERS"
    echo "-- latency over TCP alone: taiji with TAIJI_SHM=off, MPI tcp"
    TAIJI_SHM=off taiji lattcp 2 "$LAT_ITERS" --op allreduce -b 4 -e 4
    mpi lattcp 2 tcp,self allreduce 4 "$LAT_ITERS"
    TAIJI_SHM=off taiji lattcp 4 "$LAT_ITERS" --op barrier
    mpi lattcp 4 tcp,self barrier 4 "$LAT_ITERS"
  fi
  if has_case fusion && [ "$round" = 1 ]; then
    "$HERE/fusion.sh" "$BUILD" "$OUT" || FAILED=1
  fi
  if has_case netns; then
    NETNS_ALLREDUCE=$NETNS_ALLREDUCE NETNS_BROADCAST=$NETNS_BROADCAST NETNS_ITERS=$NETNS_ITERS \
      HAVE_GLOO=$HAVE_GLOO HAVE_MPI=$HAVE_MPI ROUND=$round WARMUP=$WARMUP JOB_TIMEOUT=$JOB_TIMEOUT \
      "$HERE/netns.sh" "$BUILD" "$OUT" || FAILED=1
  fi
done

echo
echo "== results (run took $((SECONDS - start)) s; rows in $RES)"
$PY "$HERE/results.py" table "$RES" "$OUT/table" "$RATE" || FAILED=1
$PY "$HERE/plot.py" "$RES" "$OUT/busbw" || note "no plot"
[ -s "$OUT/notes.txt" ] && { echo "notes:"; sed 's/^/  /' "$OUT/notes.txt"; }
exit $FAILED
