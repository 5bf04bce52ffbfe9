#!/usr/bin/env bash
# The device backend's checks on a machine with one NVIDIA GPU, in a few minutes: versions
# (nvidia-smi, torch, what taiji's loader finds), the device tests that need a GPU,
# taiji-nccl-vs-taiji with 1, 2 and 4 ranks sharing the GPU, and the contract from Python
# (bench/device/gpu_contract.py: every collective and dtype, any order, mismatch, DDP on
# CUDA tensors, kill -9) with 2 and 4 ranks; each step is bounded (at most about 20
# minutes in all, a few when things work).
#
#   scripts/gpu-check.sh [BUILD]               run from a build with -Dnccl (default: build)
#   scripts/gpu-check.sh --bundle DIR [BUILD]  copy what a run needs into DIR: the programs
#       and libtaiji without debug information, and the libraries they link that a bare
#       machine may lack (libuv, spdlog, fmt, curl, ...), for a machine that cannot build;
#       a DIR named build-* is ignored by git and can be carried there
#   scripts/gpu-check.sh DIR                   run from such a bundle
#
# NCCL and the CUDA runtime come from Python's nvidia-* wheels (nvidia-nccl-cu13, and the
# CUDA runtime torch brings) where there are some, else from the loader's usual path.
# Several ranks share the GPU as NCCL allows it: each rank says it is on a host of its own
# (NCCL_HOSTID=host<rank>), so they talk over loopback sockets.
# The log goes to $OUT/gpu-check.log when OUT is set, else to ./gpu-check.log.
# Exit: 0 every check passed, 77 no usable GPU here, 1 a check failed, 2 usage.
set -uo pipefail

die() { echo "gpu-check: $*" >&2; exit 2; }

programs=(taiji-run taiji-nccl-vs-taiji taiji-device-info taiji-device-tests)
# Where each program lives in a build.
build_path() {
  case "$1" in
    taiji-run) echo tools/taiji-run ;;
    taiji-nccl-vs-taiji|taiji-device-info) echo "bench/device/$1" ;;
    taiji-device-tests) echo tests/device/taiji-device-tests ;;
  esac
}

# The C and C++ runtime every such machine has (glibc's own parts must match its libc);
# everything else ldd names is bundled.
is_base_library() {
  case "$(basename "$1")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libresolv.so*|libanl.so*|ld-linux*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
  esac
  return 1
}

bundle() {
  local dir=$1 build=$2 p lib
  for p in "${programs[@]}"; do
    [ -x "$build/$(build_path "$p")" ] ||
      die "$build/$(build_path "$p") is missing: configure with -Dnccl=enabled and build first"
  done
  mkdir -p "$dir" || die "cannot create $dir"
  for p in "${programs[@]}"; do
    cp -f "$build/$(build_path "$p")" "$dir/$p" && strip --strip-debug "$dir/$p"
  done
  # Under its soname, as the programs ask for it.
  lib=$(readlink -f "$build/capi/libtaiji.so")
  cp -f "$lib" "$dir/$(objdump -p "$lib" | awk '/SONAME/ {print $2}')"
  strip --strip-debug "$dir"/libtaiji.so.*
  ldd "$dir"/taiji-* "$build/capi/libtaiji.so" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    sort -u | while read -r lib; do
      is_base_library "$lib" || cp -fL "$lib" "$dir/"
    done
  touch "$dir/.gpu-check-bundle"
  du -sh "$dir"
}

if [ "${1:-}" = "--bundle" ]; then
  [ $# -ge 2 ] || die "usage: $0 --bundle DIR [BUILD]"
  bundle "$2" "${3:-build}"
  exit 0
fi

root=$(cd "$(dirname "$0")/.." && pwd)
from=${1:-$root/build}
[ -d "$from" ] || die "no build or bundle at $from"
from=$(cd "$from" && pwd)
prog() {
  if [ -e "$from/.gpu-check-bundle" ]; then echo "$from/$1"; else echo "$from/$(build_path "$1")"; fi
}

log=${OUT:+$OUT/gpu-check.log}
log=${log:-$PWD/gpu-check.log}
exec > >(tee "$log") 2>&1

section() { printf '\n==== %s\n' "$*"; }

# Python's wheels: where libnccl.so.2 and libcudart.so.13 are, without importing torch.
wheel_dirs=$(python3 - <<'EOF' 2>/dev/null
import importlib.util, os
roots = []
for name in ("nvidia", "torch"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        roots += list(spec.submodule_search_locations)
dirs = []
for root in roots:
    for d, _, files in os.walk(root):
        if {"libnccl.so.2", "libcudart.so.13"} & set(files) and d not in dirs:
            dirs.append(d)
print(":".join(dirs))
EOF
)
section "versions ($(date -u '+%F %T UTC'), $(uname -srm))"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
else
  echo "nvidia-smi: not installed"
fi
timeout 60 python3 -c '
try:
    import torch
except ImportError as e:
    raise SystemExit(f"torch: not available ({e})")
print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count(),
      "NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")
'

# Only now: a bundle's libraries are for taiji's programs, not for Python's.
[ -e "$from/.gpu-check-bundle" ] && wheel_dirs=$from${wheel_dirs:+:$wheel_dirs}
export LD_LIBRARY_PATH=${wheel_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# One GPU, no network: every rank a host of its own over loopback (set per rank below).
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
echo "from: $from"
echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"

missing=0
for p in "${programs[@]}"; do
  [ -x "$(prog "$p")" ] || { echo "missing: $(prog "$p")"; missing=1; continue; }
  if ldd "$(prog "$p")" | grep -q "not found"; then
    echo "$p cannot start here:"; ldd "$(prog "$p")" | grep "not found"; missing=1
  fi
done
[ $missing = 0 ] || { echo "gpu-check: bring a bundle (scripts/gpu-check.sh --bundle)"; exit 1; }

echo -n "taiji device runtime: "
"$(prog taiji-device-info)"
info=$?
if [ $info = 77 ]; then
  echo "gpu-check: no usable GPU here; nothing else to check"
  exit 77
fi

failed=()
step() {
  local name=$1; shift
  section "$name"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "---- $name: exit $rc, $((SECONDS - t0)) s"
  [ $rc = 0 ] || failed+=("$name (exit $rc)")
}

# One process per tag, as meson runs them.
for tag in device_types device_loader device_gpu; do
  step "device tests [$tag]" timeout 60 "$(prog taiji-device-tests)" "[$tag]"
done
for n in 1 2 4; do
  # shellcheck disable=SC2016  # $TAIJI_RANK is each rank's own: it expands in the rank's shell
  step "taiji-nccl-vs-taiji, $n rank(s)" "$(prog taiji-run)" -np "$n" --timeout 120 -- \
    /bin/sh -c 'NCCL_HOSTID=host$TAIJI_RANK exec "$0" "$@"' "$(prog taiji-nccl-vs-taiji)"
done
# The contract from Python: every collective and dtype against the host path, any order,
# mismatch, DDP on CUDA tensors, and a kill -9 (bench/device/gpu_contract.py).
if [ -e "$from/.gpu-check-bundle" ]; then libtaiji=$(ls "$from"/libtaiji.so.* | head -n 1); else libtaiji=$from/capi/libtaiji.so; fi
for n in 2 4; do
  step "gpu_contract.py, $n ranks" env TAIJI_LIBRARY="$libtaiji" PYTHONPATH="$root/python" \
    timeout 420 python3 "$root/bench/device/gpu_contract.py" --ranks "$n"
done

section summary
if [ ${#failed[@]} = 0 ]; then
  echo "gpu-check: every check passed"
  exit 0
fi
printf 'gpu-check: FAILED: %s\n' "${failed[@]}"
echo "(taiji-nccl-vs-taiji exit 3: taiji's device path refused the ops; NCCL's numbers stand)"
exit 1
