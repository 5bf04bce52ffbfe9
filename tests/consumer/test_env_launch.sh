#!/bin/bash
# Starts the C consumer as 3 plain processes the way other launchers do (torchrun-style,
# Open MPI and Slurm variables, no taiji-run): rank 0 serves the rendezvous.
set -euo pipefail
consumer=$1
# A port nothing listens on now (the kernel's choice), not a random guess that may be taken.
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

run_job() {  # run_job NAME ENV-FOR-RANK-FUNCTION
  local name=$1 envfn=$2 pids=() out
  out=$(mktemp -d)
  for r in 0 1 2; do
    env -i PATH="$PATH" $($envfn $r) timeout 60 "$consumer" >"$out/$r" 2>&1 &
    pids+=($!)
  done
  local ok=1
  for r in 0 1 2; do
    wait "${pids[$r]}" || ok=0
    grep -qx "rank $r of 3 ok" "$out/$r" || ok=0
  done
  if [ $ok = 1 ]; then
    echo "ok: $name"
  else
    echo "FAILED: $name"; head -n 20 "$out"/*; rm -rf "$out"; exit 1
  fi
  rm -rf "$out"
}

# torchrun-style: the rendezvous listens on MASTER_PORT + 1, so that is the port to find free.
P=$(( $(port) - 1 ))
torchrun_env() { echo "RANK=$1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$P TAIJI_JOB_ID=tr$P TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT" torchrun_env

Q=$(port)
ompi_env() { echo "OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=3 TAIJI_RENDEZVOUS=127.0.0.1:$Q TAIJI_JOB_ID=om$Q TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "Open MPI OMPI_COMM_WORLD_RANK/SIZE" ompi_env

S=$(port)
slurm_env() { echo "SLURM_PROCID=$1 SLURM_NTASKS=3 TAIJI_RENDEZVOUS=127.0.0.1:$S TAIJI_JOB_ID=sl$S TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "Slurm SLURM_PROCID/SLURM_NTASKS" slurm_env
