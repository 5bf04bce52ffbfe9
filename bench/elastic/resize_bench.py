#!/usr/bin/env python3
"""Resize and recovery latency of elastic membership, on loopback.

usage: resize_bench.py [BUILD-DIR] [--resizes N] [--kills N] [--backends embedded,etcd]

Resize: `taiji-run -np 4 --elastic` runs tests/elastic's peer through 4 -> 8 -> 4 -> ...
(N grows and N shrinks); each member reports the time from its taiji_resize call to the
first allreduce completed on the new membership (a grow includes starting the joiners'
processes). Reported: the median and the slowest over the resizes of rank 0's times, per
direction. Recovery: N runs of 4 ranks streaming allreduces, one killed with SIGKILL; the
time from the kill to the first allreduce every survivor completed after taiji_shrink
(the last survivor's). Every run checks its results (exact sums, identical state).
"""
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
build = next((a for a in sys.argv[1:] if not a.startswith("--")), "build")
sys.argv = [sys.argv[0], os.path.join(build, "tests/elastic/taiji-elastic-peer"),
            os.path.join(build, "tools/taiji-run"), "bench", "embedded"] + sys.argv[1:]
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "elastic"))
import elastic_test as et  # noqa: E402


def option(name, default):
    args = sys.argv
    return args[args.index(name) + 1] if name in args else default


def resize_latency(etcd, n):
    job = et.Job(4, ["--sizes", ",".join(["8", "4"] * n), "--timeout-ms", "20000"], etcd, job="bench")
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    et.check_finals(job, 4, 2 * n + 1)
    zero = [r for r in job.records("resize") if r["rank"] == "0"]
    grow = [float(r["ms"]) for r in zero if r["size"] == "8"]
    shrink = [float(r["ms"]) for r in zero if r["size"] == "4"]
    return grow, shrink


def recovery(etcd):
    job = et.Job(4, ["--stream", "--after", "5", "--timeout-ms", "20000"], etcd, job="bench")
    job.wait_for("5 steps on every rank",
                 lambda: all(sum(1 for s in job.records("step") if s["rank"] == str(r)) >= 5 for r in range(4)))
    import signal
    import time
    killed_at = time.time() * 1000
    os.kill(et.pids(job)[2], signal.SIGKILL)
    rc = job.finish()
    job.check(rc == 0, f"taiji-run exited {rc}")
    et.check_finals(job, 3, 2)
    firsts = {}
    for s in job.records("step"):
        if s["version"] == "2" and s["rank"] not in firsts:
            firsts[s["rank"]] = float(s["at"])
    job.check(len(firsts) == 3, "survivors' first steps")
    return max(firsts.values()) - killed_at


def main():
    n = int(option("--resizes", "10"))
    kills = int(option("--kills", "10"))
    print("| store | 4 -> 8 median | 4 -> 8 max | 8 -> 4 median | 8 -> 4 max | kill -9 to first allreduce, median | max |")
    print("|---|---|---|---|---|---|---|")
    for backend in option("--backends", "embedded,etcd").split(","):
        etcd = et.Etcd() if backend == "etcd" else None
        try:
            grow, shrink = resize_latency(etcd, n)
            rec = [recovery(etcd) for _ in range(kills)]
        finally:
            if etcd:
                etcd.stop()
        print(f"| {backend} | {statistics.median(grow):.0f} ms | {max(grow):.0f} ms | "
              f"{statistics.median(shrink):.0f} ms | {max(shrink):.0f} ms | "
              f"{statistics.median(rec):.0f} ms | {max(rec):.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
