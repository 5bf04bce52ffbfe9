#!/usr/bin/env python3
"""A one-sided model request against a broadcast of the same bytes, on loopback.

usage: model_store_bench.py [BUILD-DIR] [--bytes N] [--runs N] [--shm auto,off]

Two processes under taiji-run. Rank 1 saves an N-byte model (default 16 MiB); each run,
rank 0 fetches it with taiji_model_request (rank 1's caller meanwhile waits in a barrier:
its I/O thread serves) and the two ranks broadcast N bytes from rank 1, the order of the
two alternating between runs. Rank 0 times each from its call to the data being in its
buffer (a barrier before each lines the ranks up); every result is checked in full.
Reported per transport setting (TAIJI_SHM=off: both over the TCP link; auto: both move
through the shared-memory ring): the median
time and bandwidth of each over the runs (after 3 warm-up runs), and their ratio.
"""
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def option(name, default):
    args = sys.argv
    return args[args.index(name) + 1] if name in args else default


def worker():
    sys.path.insert(0, os.path.join(REPO, "python"))
    import numpy as np
    import taiji
    nbytes, runs = int(os.environ["BENCH_BYTES"]), int(os.environ["BENCH_RUNS"])
    warmup = 3
    with taiji.Peer() as p:
        model = (np.arange(nbytes, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
        if p.rank == 1:
            p.model_save("model", model)
        buf = np.empty(nbytes, np.uint8)
        times = {"request": [], "broadcast": []}
        for i in range(warmup + runs):
            order = ["request", "broadcast"] if i % 2 == 0 else ["broadcast", "request"]
            for what in order:
                buf[:] = 0
                p.barrier("line up")
                start = time.perf_counter()
                if what == "request":
                    if p.rank == 0:
                        p.model_request(1, "model", buf)
                else:
                    if p.rank == 1:
                        buf[:] = model
                    p.broadcast(buf, "bcast", root=1)
                took = time.perf_counter() - start
                p.barrier("done")
                if p.rank == 0:
                    if not np.array_equal(buf, model):
                        raise SystemExit(f"run {i}: {what} delivered wrong bytes")
                    if i >= warmup:
                        times[what].append(took)
        if p.rank == 0:
            print("RESULT", statistics.median(times["request"]), statistics.median(times["broadcast"]),
                  flush=True)


def main():
    build = next((a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()
                  and a not in option_values()), "build")
    nbytes = int(option("--bytes", str(16 << 20)))
    runs = int(option("--runs", "20"))
    rows = []
    for shm in option("--shm", "off,auto").split(","):
        env = dict(os.environ, BENCH_BYTES=str(nbytes), BENCH_RUNS=str(runs), TAIJI_SHM=shm,
                   TAIJI_LIBRARY=os.path.join(build, "capi", "libtaiji.so"))
        out = subprocess.run([os.path.join(build, "tools", "taiji-run"), "-np", "2", "--timeout", "300",
                              sys.executable, os.path.abspath(__file__), "--worker"],
                             env=env, capture_output=True, text=True, timeout=360)
        line = next((l for l in out.stdout.splitlines() if "RESULT" in l), None)
        if out.returncode != 0 or line is None:
            sys.exit(f"TAIJI_SHM={shm}: taiji-run exited {out.returncode}\n{out.stdout}\n{out.stderr}")
        request, broadcast = (float(x) for x in line.split("RESULT", 1)[1].split())
        rows.append((shm, request, broadcast))
    mib = nbytes / (1 << 20)
    print(f"{mib:g} MiB, 2 processes on loopback, median of {runs} runs (rank 0's time)")
    print("| TAIJI_SHM | request ms | request GB/s | broadcast ms | broadcast GB/s | request / broadcast bandwidth |")
    print("|---|---:|---:|---:|---:|---:|")
    for shm, request, broadcast in rows:
        print(f"| {shm} | {request * 1e3:.2f} | {nbytes / request / 1e9:.2f} | {broadcast * 1e3:.2f} | "
              f"{nbytes / broadcast / 1e9:.2f} | {broadcast / request:.2f} |")


def option_values():
    args = sys.argv
    return {args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
