#!/usr/bin/env python3
"""Straggler benchmark: time for 4 ranks to train the digits MLP to a target accuracy while
one rank sleeps every step, under BSP and under the online Sync-Switch policy.

usage: straggler_bench.py [BUILD-DIR] [--runs N] [--sleep S] [--target A]

Each run is bench/adapt/straggler_job.py under taiji-run -np 4 (rank 1 sleeps S seconds a
step, 0.05 by default). The target defaults to 0.96: BSP's final accuracy on this model
(0.969 after 15 epochs, examples/adaptive_digits.py) less 1 %. BSP and online runs
alternate; reported are the medians of the seconds to the target (evaluation left out),
the samples it took, the accuracy reached, and the ratio online / BSP.
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def run(build, policy, sleep, target):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               TAIJI_LIBRARY=os.path.join(build, "capi", "libtaiji.so"))
    cmd = [os.path.join(build, "tools", "taiji-run"), "--no-tag", "--timeout", "300", "-np", "4",
           "/usr/bin/python3", os.path.join(ROOT, "bench", "adapt", "straggler_job.py"),
           "--policy", policy, "--sleep", str(sleep), "--target", str(target)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=360)
    if out.returncode != 0:
        sys.exit(f"{policy} run failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    result = json.loads(line)
    if not result["reached"]:
        sys.exit(f"{policy} run did not reach {target}: {result}")
    return result


def main():
    args = sys.argv[1:]
    valued = {"--runs", "--sleep", "--target"}
    positional = [a for i, a in enumerate(args)
                  if not a.startswith("--") and (i == 0 or args[i - 1] not in valued)]
    build = os.path.abspath(positional[0] if positional else "build")
    runs, sleep = int(option("--runs", 3)), float(option("--sleep", 0.05))
    target = float(option("--target", 0.96))
    got = {"bsp": [], "online": []}
    for i in range(runs):
        for policy in ("bsp", "online"):
            r = run(build, policy, sleep, target)
            got[policy].append(r)
            print(f"run {i + 1} {policy:6}: {r['seconds']:7.2f} s, {r['samples']:7d} samples, "
                  f"accuracy {r['accuracy']:.4f}, final mode {r['mode']}, switches {r['switches']}",
                  flush=True)
    med = {p: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "samples", "accuracy")}
           for p, rs in got.items()}
    print()
    print(f"| policy | seconds to {target} | samples | accuracy reached |")
    print("|---|---|---|---|")
    for p in ("bsp", "online"):
        m = med[p]
        print(f"| {p} | {m['seconds']:.2f} | {m['samples']:.0f} | {m['accuracy']:.4f} |")
    print(f"\nonline / bsp time: {med['online']['seconds'] / med['bsp']['seconds']:.2f} "
          f"(medians of {runs} runs each; rank 1 sleeps {sleep} s a step)")


if __name__ == "__main__":
    main()
