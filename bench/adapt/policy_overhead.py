"""What adaptation costs a training step when no policy acts: the same training-like step
(a 4 MiB float32 allreduce plus some compute) ended by taiji_step_mark, or by
taiji_adapt_step carrying every built-in policy, configured so that none takes an action.

    PYTHONPATH=python TAIJI_LIBRARY=build/capi/libtaiji.so \\
        build/tools/taiji-run -np 4 /usr/bin/python3 bench/adapt/policy_overhead.py

The two loops alternate in blocks (--blocks blocks of --steps steps each), so that drift in
the machine's load falls on both alike. Each step's wall time is taken on every rank; the
reported time per loop is the median over rank 0's steps, and the overhead is the
difference of the medians over the step_mark median; the medians of the ending call
alone (taiji_step_mark, taiji_adapt_step) are shown too. Every allreduce result is checked,
and the engine must return no action. Rank 0 prints the table (or JSON with --json).
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import taiji
from taiji.adapt import Engine

# Every built-in, parameterised so that a healthy steady loop gives it no reason to act:
# the offline switch lies beyond the samples this run trains on, the online switch and the
# topology vote need a slowdown far beyond noise, no gradient statistics are attached, and
# no size is scheduled or requested.
POLICIES = [
    ("sync_switch_offline", {"fraction": 1.0, "total_samples": 1e15}),
    ("sync_switch_online", {"k": 3, "m": 50}),
    ("adaptive_topology", {"threshold": 0.2, "window": 10}),
    ("batch_advice", {}),
    ("elastic", {}),  # polls the requested size every step: the costliest setting
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--compute", type=int, default=384, help="matrix side of the compute")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--skip", action="append", default=[],
                        help="leave this built-in out (repeatable), to see what each costs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    peer = taiji.Peer()
    rank, size = peer.rank, peer.size
    count = int(args.mib * (1 << 20)) // 4
    grad = np.full(count, float(rank + 1), dtype=np.float32)
    out = np.empty_like(grad)
    want = float(size * (size + 1) // 2)
    a = np.random.default_rng(rank).standard_normal((args.compute, args.compute)).astype(np.float32)
    engine = Engine(peer)
    for name, params in POLICIES:
        if name not in args.skip:
            engine.add(name, **params)
    actions = []
    times = {"step_mark": [], "adapt_step": []}
    calls = {"step_mark": [], "adapt_step": []}

    def step(mode):
        start = time.perf_counter()
        b = a @ a  # the step's compute
        peer.allreduce(grad, "grad", out=out)
        if out[0] != want or out[-1] != want:
            sys.exit(f"rank {rank}: allreduce gave {out[0]}, {out[-1]}, want {want}")
        end = time.perf_counter()
        if mode == "step_mark":
            peer.step_mark()
        else:
            actions.extend(engine.step(samples=32))
        now = time.perf_counter()
        times[mode].append(now - start)
        calls[mode].append(now - end)
        return b

    for mode in ("step_mark", "adapt_step"):  # warm-up, not counted
        for i in range(5):
            step(mode)
    times = {"step_mark": [], "adapt_step": []}
    calls = {"step_mark": [], "adapt_step": []}
    for _ in range(args.blocks):
        for mode in ("step_mark", "adapt_step"):
            for i in range(args.steps):
                step(mode)
    engine.close()
    peer.close()
    if actions:
        sys.exit(f"rank {rank}: the engine acted: {actions}")
    if rank != 0:
        return
    mark = statistics.median(times["step_mark"]) * 1e3
    adapt = statistics.median(times["adapt_step"]) * 1e3
    mark_call = statistics.median(calls["step_mark"]) * 1e3
    adapt_call = statistics.median(calls["adapt_step"]) * 1e3
    row = {"ranks": size, "policies": len(POLICIES) - len(set(args.skip)), "mib": args.mib, "steps": len(times["step_mark"]),
           "step_mark_ms": round(mark, 3), "adapt_step_ms": round(adapt, 3),
           "overhead_pct": round(100 * (adapt - mark) / mark, 2),
           "step_mark_call_ms": round(mark_call, 3), "adapt_step_call_ms": round(adapt_call, 3)}
    if args.json:
        print(json.dumps(row))
        return
    print("| ranks | allreduce | steps per loop | step with step_mark (ms) | step with adapt_step (ms) "
          "| overhead | the mark call (ms) | the adapt_step call (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {size} | {args.mib:g} MiB | {row['steps']} | {mark:.3f} | {adapt:.3f} "
          f"| {row['overhead_pct']:+.2f} % | {mark_call:.3f} | {adapt_call:.3f} |")


if __name__ == "__main__":
    main()
