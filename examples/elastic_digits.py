"""Elastic data-parallel training over taiji: the digits MLP while the job grows and shrinks.

    PYTHONPATH=python build/tools/taiji-run -np 2 --elastic --max-np 4 \\
        /usr/bin/python3 examples/elastic_digits.py --request 40:4 --request 120:2

and, from another shell, ``build/tools/taiji-run --resize N --store ADDR --job-id J`` with
the address and job id this taiji-run printed (``--request STEP:N`` makes rank 0 run that
command itself after step STEP, for a repeatable demonstration). Ranks a resize adds are
started by taiji-run, receive the state from rank 0 and join the training; ranks a shrink
removes leave.

Each step takes a global batch of --global-batch samples (a fixed permutation per epoch),
split evenly between the ranks, and DistributedOptimizer averages the ranks' gradients: the
gradient is the mean over the global batch whatever the size, so the training, and its
accuracy, does not depend on the sizes the job goes through (up to rounding). The global
batch must be a multiple of every size the job takes. Exits with status 1 below --target
(default 0.9) or when the final ranks' parameters differ.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import taiji.torch as hvd
from taiji.torch import elastic


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=64,
                        help="samples per step over all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    parser.add_argument("--request", action="append", default=[], metavar="STEP:N",
                        help="rank 0 asks for N ranks (taiji-run --resize) after step STEP")
    parser.add_argument("--launcher", default=None,
                        help="taiji-run for --request (default: build/tools/taiji-run of "
                             "this tree, else taiji-run on PATH)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--json", action="store_true", help="print one JSON line per rank")
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train),
            torch.from_numpy(x_test), torch.from_numpy(y_test))


def launcher(path):
    if path:
        return path
    built = pathlib.Path(__file__).resolve().parents[1] / "build" / "tools" / "taiji-run"
    return str(built) if built.exists() else (shutil.which("taiji-run") or "taiji-run")


def ask_for(size, path):
    """What an operator would type: the store and job id come from the rank's environment."""
    subprocess.run([launcher(path), "--resize", str(size), "--store",
                    os.environ["TAIJI_RENDEZVOUS"], "--job-id", os.environ["TAIJI_JOB_ID"]],
                   check=True, timeout=30)


def main():
    args = parse_args()
    requests = {}
    for item in args.request:
        step, size = item.split(":")
        requests[int(step)] = int(size)
    hvd.init()
    x, y, x_test, y_test = load_data()
    steps_per_epoch = len(x) // args.global_batch
    total_steps = args.epochs * steps_per_epoch

    # Different seeds on purpose: the first sync makes every rank start from rank 0's.
    torch.manual_seed(args.seed + hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters())
    # sizes: (step, size) each time the training (re)started on a membership.
    state = elastic.State(model, optimizer, step=0, sizes=[])
    loss_fn = torch.nn.CrossEntropyLoss()
    asked = set()

    @elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        if args.global_batch % size:
            raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of the "
                             f"size {size}")
        if not state.sizes or state.sizes[-1][1] != size:
            state.sizes.append((state.step, size))
        if rank == 0 and not args.json:
            print(f"step {state.step}: training on {size} ranks", flush=True)
        while state.step < total_steps:
            epoch, i = divmod(state.step, steps_per_epoch)
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
                args.seed * 1000 + epoch))
            idx = order[i * args.global_batch:(i + 1) * args.global_batch][rank::size]
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
            state.step += 1
            if rank == 0 and state.step in requests and state.step not in asked:
                asked.add(state.step)
                ask_for(requests[state.step], args.launcher)
            if state.step % args.commit_every == 0 or state.step == total_steps:
                state.commit()

    train(state)
    if state.detached:
        if args.json:
            print(json.dumps({"detached": True, "step": state.step}), flush=True)
        return 0

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    digest = hvd.allgather_object(
        b"".join(v.numpy().tobytes() for _, v in sorted(model.state_dict().items())).hex(),
        name="digest")
    same = all(d == digest[0] for d in digest)
    peer = hvd.peer()
    if args.json:
        print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "accuracy": accuracy,
                          "same": same, "steps": state.step, "sizes": state.sizes,
                          "cluster_version": peer.cluster_version,
                          "joined_version": peer.joined_version}), flush=True)
    elif hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f} (target {args.target}) after {state.step} steps "
              f"on sizes {state.sizes}; parameters equal on all {hvd.size()} ranks: {same}",
              flush=True)
    hvd.shutdown()
    return 0 if accuracy >= args.target and same else 1


if __name__ == "__main__":
    sys.exit(main())
