#!/usr/bin/env python3
"""One rank of the adaptive-topology benchmark (bench/adapt/topology_run.sh runs it under
taiji-run, one rank per emulated host).

Every iteration allreduces --size bytes of f32 and then takes an adaptation step with the
built-in adaptive_topology policy. With --policy off the step carries no policy, so the
job stays on the default strategy: the baseline. After iteration --throttle-at, rank 0 runs
--throttle-cmd (which slows one host's link) and every rank waits at a barrier, so the
slowdown starts at the same iteration in both runs. Rank 0 prints one JSON line per
iteration: {"iter", "seconds", "gbps" (algorithm bandwidth), "topology", "action"}.
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np

import taiji
from taiji.adapt import Engine


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32 << 20)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--throttle-at", type=int, default=10)
    p.add_argument("--throttle-cmd", default="")
    p.add_argument("--policy", default="adaptive_topology")
    p.add_argument("--timeout-ms", type=int, default=120000)
    args = p.parse_args()

    peer = taiji.Peer()
    engine = Engine(peer)
    if args.policy != "off":
        engine.add(args.policy)
    x = np.ones(args.size // 4, dtype=np.float32)
    topology = "default"
    for it in range(args.iters):
        if it == args.throttle_at and args.throttle_cmd:
            if peer.rank == 0:
                subprocess.run(args.throttle_cmd, shell=True, check=True, timeout=60)
            peer.barrier(name="throttled", timeout_ms=args.timeout_ms)
        start = time.perf_counter()
        peer.allreduce(x, name="grad", out=x, timeout_ms=args.timeout_ms)
        seconds = time.perf_counter() - start
        actions = engine.step(samples=1, timeout_ms=args.timeout_ms)
        applied = [a for a in actions if a.kind == "set_topology"]
        if applied:
            topology = applied[0].topology
        if peer.rank == 0:
            print(json.dumps({"iter": it, "seconds": round(seconds, 4),
                              "gbps": round(args.size * 8 / seconds / 1e9, 3),
                              "topology": topology,
                              "action": applied[0].reason if applied else ""}), flush=True)
        x.fill(1.0)
    engine.close()
    peer.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
