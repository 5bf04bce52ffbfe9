"""Measures what DistributedOptimizer's gradient buckets buy: training steps with one
allreduce per parameter against 1 MiB buckets, side by side in one run (rounds alternate,
so both see the same machine load); and the communication alone of many small tensors:
one async allreduce each, against grouped_allreduce (one flat allreduce per dtype).

    PYTHONPATH=python build/tools/taiji-run -np 2 /usr/bin/python3 examples/horovod_buckets.py

Rank 0 prints the median time per step / per round of each, in milliseconds.
"""

import argparse
import statistics
import time

import torch

import taiji.torch.horovod as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20, help="hidden layers")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30, help="per round and setting")
    return parser.parse_args()


def make_model(layers, width):
    torch.manual_seed(0)
    mods = [torch.nn.Linear(64, width), torch.nn.ReLU()]
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 10))


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()
    runs = {}
    for label, bucket in (("per parameter", 0), ("1 MiB buckets", 1 << 20)):
        model = make_model(args.layers, args.width)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(),
                                       bucket_bytes=bucket)
        runs[label] = (model, opt)
    grads = [p.detach().clone() for p in runs["per parameter"][0].parameters()]
    names = [f"t{i}" for i in range(len(grads))]

    def train(model, opt):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    def each():
        for h in [hvd.allreduce_async_(g, name=n) for g, n in zip(grads, names)]:
            hvd.synchronize(h)

    def grouped():
        hvd.grouped_allreduce_(grads, name="grads")

    cases = {f"step, {label}": (lambda m=m, o=o: train(m, o)) for label, (m, o) in runs.items()}
    cases[f"{len(grads)} tensors, one allreduce each"] = each
    cases[f"{len(grads)} tensors, grouped_allreduce"] = grouped
    times = {name: [] for name in cases}
    for fn in cases.values():  # warm-up
        for _ in range(5):
            fn()
    for _ in range(args.rounds):
        for name, fn in cases.items():
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    if hvd.rank() == 0:
        params = sum(p.numel() for p in runs["per parameter"][0].parameters())
        print(f"{hvd.size()} ranks, {len(grads)} parameter tensors, {params} floats")
        for name, ms in times.items():
            print(f"  {name:40s} median {statistics.median(ms):7.3f} ms")
    hvd.shutdown()


if __name__ == "__main__":
    main()
