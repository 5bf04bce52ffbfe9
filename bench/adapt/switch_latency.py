#!/usr/bin/env python3
"""Switch latency BSP <-> pair averaging, in place (run under taiji-run -np 4).

    PYTHONPATH=python TAIJI_LIBRARY=build/capi/libtaiji.so \\
        build/tools/taiji-run -np 4 /usr/bin/python3 bench/adapt/switch_latency.py

For each model size (--params, millions of float32 parameters, SGD with momentum), trains a
few steps under BSP, then switches to pair and back --rounds times, two steps in between.
A switch is timed on every rank from the call to its return (AdaptiveOptimizer's
Switch.seconds: entering pair saves the model and meets at a barrier; entering BSP averages
parameters and momentum by one allreduce and broadcasts rank 0's result). Rank 0 prints,
per size, the median and the largest over rounds of the slowest rank's time, each way.
Sync-Switch switches by checkpoint and restart: 1.9 to 3.7 minutes.
"""
import argparse
import statistics
import sys

import torch

import taiji
import taiji.torch as ttorch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", default="0.01,1,11,25",
                   help="millions of parameters, comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    ttorch.init()
    rank, peer = ttorch.rank(), ttorch.peer()
    if rank == 0:
        print("| parameters | to pair: median (max) ms | to bsp: median (max) ms |")
        print("|---|---|---|")
    for millions in [float(m) for m in args.params.split(",")]:
        width = 1000
        rows = max(1, int(millions * 1e6 / width))
        model = torch.nn.Linear(width, rows, bias=False)
        opt = ttorch.AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                       "bsp", batch_size=8, prefix=f"lat{millions}")
        x = torch.randn(8, width)

        def train(n):
            for _ in range(n):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()

        train(2)
        times = {"pair": [], "bsp": []}
        for _ in range(args.rounds):
            for mode in ("pair", "bsp"):
                s = opt.switch_mode(mode)
                worst = torch.tensor([s.seconds], dtype=torch.float64)
                peer.allreduce(worst.numpy(), name=f"lat.{millions}", op=taiji.MAX, out=worst.numpy())
                times[mode].append(worst.item() * 1000)
                train(2)
        if rank == 0:
            cells = [f"{statistics.median(times[m]):.1f} ({max(times[m]):.1f})" for m in ("pair", "bsp")]
            print(f"| {millions:g} M ({millions * 4:g} MB) | {cells[0]} | {cells[1]} |", flush=True)
    ttorch.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
