#!/usr/bin/env python3
"""One run of the straggler benchmark (bench/adapt/straggler_bench.py starts it under
taiji-run -np 4): the digits MLP of examples/adaptive_digits.py, rank --slow-rank sleeping
--sleep seconds every step, trained until the ranks' averaged model reaches --target test
accuracy (or --max-samples). --policy bsp stays in BSP; --policy online lets the engine's
sync_switch_online move the job to pair averaging. Every --eval-samples samples (counted as
every rank agrees: the engine's total) the ranks average their models into a copy by one
allreduce and each evaluates that same copy, so all stop at the same point. Rank 0 prints
one JSON line: seconds to the target (evaluation time left out), samples, accuracy, mode,
switches.
"""
import argparse
import json
import pathlib
import sys
import time

import torch

import taiji.torch as ttorch
from taiji.adapt import Engine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from adaptive_digits import load_data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", choices=["bsp", "online"], required=True)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--max-samples", type=int, default=400_000)
    p.add_argument("--eval-samples", type=int, default=2048)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    ttorch.init()
    rank, size, peer = ttorch.rank(), ttorch.size(), ttorch.peer()
    x, y, x_test, y_test = load_data()
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    engine = Engine(peer)
    if args.policy == "online":
        engine.add("sync_switch_online", k=1.5, m=5)
    opt = ttorch.AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                   "bsp", batch_size=args.batch, engine=engine, ramp_steps=20,
                                   mode_options={"pair": {"seed": args.seed}})
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    flat = torch.zeros(sum(q.numel() for q in model.parameters()))

    def averaged_accuracy():
        torch.cat([q.detach().reshape(-1) for q in model.parameters()], out=flat)
        peer.allreduce(flat.numpy(), name="bench.eval", out=flat.numpy())
        copy = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))
        torch.nn.utils.vector_to_parameters(flat / size, copy.parameters())
        with torch.no_grad():
            return (copy(x_test).argmax(1) == y_test).float().mean().item()

    trained = 0.0
    start = time.monotonic()
    next_eval, accuracy = args.eval_samples, 0.0
    while opt.samples < args.max_samples:
        idx = torch.randint(len(x), (args.batch,), generator=gen)
        if rank == args.slow_rank:
            time.sleep(args.sleep)
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
        if opt.samples >= next_eval:  # the same step on every rank: samples are agreed
            trained += time.monotonic() - start
            accuracy = averaged_accuracy()
            next_eval = opt.samples + args.eval_samples
            if accuracy >= args.target:
                break
            start = time.monotonic()
    if rank == 0:
        print(json.dumps({"policy": args.policy, "seconds": round(trained, 3),
                          "samples": opt.samples, "accuracy": round(accuracy, 4),
                          "reached": accuracy >= args.target, "mode": opt.mode,
                          "switches": [[s.step, s.from_mode, s.to_mode, round(s.seconds, 4)]
                                       for s in opt.switches]}), flush=True)
    engine.close()
    ttorch.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
