"""DistributedDataParallel over taiji: an MLP on scikit-learn's digits.

    PYTHONPATH=python build/tools/taiji-run -np 4 /usr/bin/python3 examples/ddp_digits.py

An unchanged DDP script but for ``import taiji.torch`` (which registers the "taiji"
backend) and ``--backend``: each rank trains on its shard of the training set, DDP
averages the gradients, and rank 0 prints the test accuracy (the same bits on every
rank). With the defaults (4 ranks, 12 epochs) it reaches about 0.97; it exits with status
1 below --target (default 0.9). ``--backend gloo`` runs the same training over gloo (also
under taiji-run); ``--hook grad_stats`` also prints the gradient noise scale and SNR that
taiji measures in the same allreduce. Works under torchrun as well.
"""

import argparse
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import taiji.torch  # noqa: F401  (registers the "taiji" backend)
from taiji.torch import hooks


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["taiji", "gloo"], default="taiji")
    parser.add_argument("--hook", choices=["none", "allreduce", "grad_stats"], default="none",
                        help="a taiji comm hook (taiji backend only)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
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


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def main():
    args = parse_args()
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    (x, y), (x_test, y_test) = load_shards(rank, size)
    torch.manual_seed(rank)  # DDP broadcasts rank 0's parameters at construction
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    state = None
    if args.hook == "allreduce":
        model.register_comm_hook(None, hooks.allreduce_hook)
    elif args.hook == "grad_stats":
        state = hooks.GradStatsState(batch_size=args.batch_size)
        model.register_comm_hook(state, hooks.grad_stats_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234 + rank)
    steps = steps_per_epoch(len(load_digits().target) - len(y_test), size, args.batch_size)
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    result = {"rank": rank, "size": size, "backend": args.backend, "accuracy": accuracy}
    if state is not None:
        result.update(noise_scale=state.noise_scale, snr=state.snr)
    if args.json:
        print(json.dumps(result), flush=True)
    elif rank == 0:
        extra = (f", noise scale {state.noise_scale:.1f}, SNR {state.snr:.3f}"
                 if state is not None else "")
        print(f"{args.backend}: {size} ranks, test accuracy {accuracy:.4f}{extra}", flush=True)
    dist.destroy_process_group()
    return 0 if accuracy >= args.target else 1


def steps_per_epoch(train_size, size, batch_size):
    # Every rank must run the same number of steps (DDP allreduces each one): the
    # smallest shard decides.
    return (train_size // size) // batch_size


if __name__ == "__main__":
    sys.exit(main())
