"""Horovod-style data-parallel training over taiji: an MLP on scikit-learn's digits.

    PYTHONPATH=python build/tools/taiji-run -np 4 /usr/bin/python3 examples/horovod_digits.py

A Horovod script ported by its import line: each rank trains on its shard of the training
set, DistributedOptimizer averages the gradients, and rank 0 prints the test accuracy of
the model (the same bits on every rank). With the defaults (4 ranks, 12 epochs) it reaches
0.96-0.98; it exits with status 1 below --target (default 0.9).
"""

import argparse
import json
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import taiji.torch as hvd  # was: import horovod.torch as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="per rank; scaled by size")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument("--backward-passes", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--json", action="store_true", help="print one JSON line per rank")
    return parser.parse_args()


def load_shards(rank, size):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    return ((torch.from_numpy(x_train[rank::size]), torch.from_numpy(y_train[rank::size])),
            (torch.from_numpy(x_test), torch.from_numpy(y_test)))


def main():
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    (x, y), (x_test, y_test) = load_shards(rank, size)

    # Different seeds on purpose: broadcast_parameters makes every rank start from rank 0's.
    torch.manual_seed(1234 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=getattr(hvd.Compression, args.compression),
        backward_passes_per_step=args.backward_passes)

    # Every rank must take the same number of steps: the shortest shard decides.
    shard = hvd.allreduce(torch.tensor([len(x)]), name="shard", op=hvd.Min).item()
    micro = args.batch_size
    steps = shard // (micro * args.backward_passes)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for step in range(steps):
            optimizer.zero_grad()
            for k in range(args.backward_passes):
                start = (step * args.backward_passes + k) * micro
                idx = order[start:start + micro]
                loss = loss_fn(model(x[idx]), y[idx]) / args.backward_passes
                loss.backward()
                total += loss.item()
            optimizer.step()
        mean_loss = hvd.allreduce(torch.tensor([total / steps]), name="loss").item()
        if rank == 0 and not args.json:
            print(f"epoch {epoch + 1}: mean loss {mean_loss:.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    digest = float(sum(p.double().sum() for p in model.parameters()))
    digests = hvd.allgather_object(digest, name="digest")
    same = all(d == digests[0] for d in digests)
    if args.json:
        print(json.dumps({"rank": rank, "accuracy": accuracy, "same": same,
                          "loss": mean_loss, "steps": steps}), flush=True)
    elif rank == 0:
        print(f"test accuracy {accuracy:.4f} (target {args.target}); "
              f"parameters equal on all {size} ranks: {same}", flush=True)
    hvd.shutdown()
    return 0 if accuracy >= args.target and same else 1


if __name__ == "__main__":
    sys.exit(main())
