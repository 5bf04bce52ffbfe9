#!/bin/bash
# Starts the C consumer as 3 plain processes the way other launchers do (torchrun-style,
# Open MPI and Slurm variables, no taiji-run): rank 0 serves the rendezvous.
set -euo pipefail
consumer=$1
# A loopback port nothing listens on now, below the ephemeral range (tests/support/free_port.py).
port() { python3 "$(dirname "$0")/../support/free_port.py"; }

# run_job NAME ENV-FUNCTION: ENV-FUNCTION RANK PORT prints the environment of one rank whose
# rendezvous listens on PORT. Another test may still bind PORT first: then the job is run again
# on a new port (at most three times); any other failure fails at once.
run_job() {
  local name=$1 envfn=$2 attempt
  for attempt in 1 2 3; do
    local p pids=() out ok=1
    p=$(port)
    out=$(mktemp -d)
    for r in 0 1 2; do
      env -i PATH="$PATH" $($envfn $r $p) timeout 60 "$consumer" >"$out/$r" 2>&1 &
      pids+=($!)
    done
    for r in 0 1 2; do
      wait "${pids[$r]}" || ok=0
      grep -qx "rank $r of 3 ok" "$out/$r" || ok=0
    done
    if [ $ok = 1 ]; then
      echo "ok: $name"; rm -rf "$out"; return 0
    fi
    if [ $attempt -lt 3 ] && grep -q "cannot listen on .*Address already in use" "$out/0"; then
      echo "port $p was taken before rank 0 listened; again on another"; rm -rf "$out"; continue
    fi
    echo "FAILED: $name"; head -n 20 "$out"/*; rm -rf "$out"; exit 1
  done
}

# torchrun-style: the rendezvous listens on MASTER_PORT + 1.
torchrun_env() { echo "RANK=$1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(($2 - 1)) TAIJI_JOB_ID=tr$2 TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT" torchrun_env

ompi_env() { echo "OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=3 TAIJI_RENDEZVOUS=127.0.0.1:$2 TAIJI_JOB_ID=om$2 TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "Open MPI OMPI_COMM_WORLD_RANK/SIZE" ompi_env

slurm_env() { echo "SLURM_PROCID=$1 SLURM_NTASKS=3 TAIJI_RENDEZVOUS=127.0.0.1:$2 TAIJI_JOB_ID=sl$2 TAIJI_INIT_TIMEOUT_MS=20000"; }
run_job "Slurm SLURM_PROCID/SLURM_NTASKS" slurm_env
