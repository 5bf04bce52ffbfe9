"""Hybrid synchronisation on the digits MLP: Sync-Switch's policies over taiji.

    PYTHONPATH=python build/tools/taiji-run -np 4 /usr/bin/python3 examples/adaptive_digits.py

trains with taiji.torch.AdaptiveOptimizer under Sync-Switch's offline policy: BSP for the
first --fraction of the samples, then --then (pair averaging by default, AD-PSGD over the
model store). With ``--straggler RANK:SECONDS`` rank RANK sleeps that long every step from
--slow-from to --slow-until of the samples (the middle third by default) and the online policy of taiji.adapt's engine
(sync_switch_online) moves the job to pair averaging while it lags and back to BSP after;
``--batch-advice`` adds the engine's batch_advice policy and applies what it advises (batch
per rank and learning rate). Each rank takes its slice of the same global batch from a fixed
permutation per epoch, so a run is repeatable. Prints each switch and the final accuracy of
the averaged model; exits with status 1 below --target (default 0.94).
"""

import argparse
import json
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import taiji.torch as ttorch


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05, help="BSP's learning rate")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="offline policy: share of the samples trained under BSP")
    parser.add_argument("--then", default="pair", help="offline policy: the mode after BSP")
    parser.add_argument("--straggler", default=None, metavar="RANK:SECONDS",
                        help="slow RANK down by SECONDS a step; the online policy reacts")
    parser.add_argument("--slow-from", type=float, default=1 / 3,
                        help="--straggler: from this share of the samples ...")
    parser.add_argument("--slow-until", type=float, default=2 / 3,
                        help="--straggler: ... until this one")
    parser.add_argument("--no-policy", action="store_true",
                        help="--straggler: stay in BSP (the baseline the policy is measured against)")
    parser.add_argument("--json", action="store_true", help="rank 0 ends with one JSON line")
    parser.add_argument("--batch-advice", action="store_true",
                        help="apply the engine's batch-size advice")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="--batch-advice: advice past this batch per rank is not taken")
    parser.add_argument("--target", type=float, default=0.94)
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train),
            torch.from_numpy(x_test), torch.from_numpy(y_test))


def make_engine(args, stats):
    from taiji.adapt import Engine
    # The batch advice reads the gradient noise scale that BSP's allreduce measures into
    # ``stats`` (the optimizer feeds it, the engine reads it).
    engine = Engine(ttorch.peer(), grad_stats=stats)
    if args.straggler and not args.no_policy:
        engine.add("sync_switch_online", k=1.5, m=5)
    if args.batch_advice:
        # At most a doubling every 25 steps: the digits set is small.
        engine.add("batch_advice", interval=25, max_scale=2.0)
    return engine


def main():
    args = parse_args()
    ttorch.init()
    rank, size = ttorch.rank(), ttorch.size()
    x, y, x_test, y_test = load_data()
    total = args.epochs * len(x)
    slow_rank, slow_s = (None, 0.0)
    if args.straggler:
        r, s = args.straggler.split(":")
        slow_rank, slow_s = int(r), float(s)

    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    stats = ttorch.peer().grad_stats(batch_size=args.batch) if args.batch_advice else None
    engine = make_engine(args, stats) if (args.straggler or args.batch_advice) else None
    opt = ttorch.AdaptiveOptimizer(sgd, "bsp", batch_size=args.batch, engine=engine,
                                   grad_stats=stats,
                                   ramp_steps=20, mode_options={"pair": {"seed": args.seed}},
                                   check_seconds=0.1)
    if not args.straggler:
        opt.switch_at(int(args.fraction * total), args.then)
    loss_fn = torch.nn.CrossEntropyLoss()
    epoch, pos, order = -1, len(x), None
    seen = 0
    start = time.monotonic()
    while opt.samples < total:
        glob = opt.batch_size * size
        if pos + glob > len(x):
            epoch, pos = epoch + 1, 0
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
                args.seed * 1000 + epoch))
        idx = order[pos:pos + glob][rank::size]
        pos += glob
        if rank == slow_rank and args.slow_from * total <= opt.samples < args.slow_until * total:
            time.sleep(slow_s)
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
        for action in opt.batch_advice:
            old = opt.batch_size
            if round(old * action.batch_scale) > args.max_batch:
                continue  # every rank sees the same advice and skips it alike
            opt.apply_batch_advice(action)
            if rank == 0:
                print(f"step {opt.steps}: batch per rank {old} -> {opt.batch_size}, "
                      f"lr x{action.lr_scale:.3g} ({action.reason})", flush=True)
        for s in opt.switches[seen:]:
            if rank == 0:
                print(f"step {s.step} ({s.samples} samples): {s.from_mode} -> {s.to_mode}, "
                      f"lr x{s.lr_scale:g}, {s.seconds * 1000:.1f} ms ({s.reason})", flush=True)
        seen = len(opt.switches)
    seconds = time.monotonic() - start
    # Every mode but BSP leaves replicas apart: the model is their mean.
    opt.average_models()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if rank == 0:
        print(f"test accuracy {accuracy:.4f} (target {args.target}) after {opt.steps} steps, "
              f"{opt.samples} samples, {seconds:.1f} s; final mode {opt.mode}, "
              f"{len(opt.switches)} switches", flush=True)
        if args.json:
            print(json.dumps({"accuracy": accuracy, "seconds": seconds, "samples": opt.samples,
                              "steps": opt.steps, "mode": opt.mode,
                              "switches": [[w.step, w.from_mode, w.to_mode, w.seconds]
                                           for w in opt.switches]}), flush=True)
    if engine is not None:
        engine.close()
    ttorch.shutdown()
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
