"""Steps per second of one training, side by side: DDP over gloo, DDP over taiji, and
taiji's Horovod-style DistributedOptimizer.

    PYTHONPATH=python build/tools/taiji-run -np 4 /usr/bin/python3 bench/python/train_bench.py

Every mode trains the same MLP on scikit-learn's digits from the same initial weights,
with the same shards, batches, seed and optimizer, for --epochs epochs per round; the
modes take turns within each round (so the machine's noise hits them alike), and rank 0
prints, per mode, the median steps/s over --rounds rounds, the ratio to gloo and the test
accuracy reached. One process per rank holds all three: a "taiji" default group, a
"gloo" group over the same ranks, and the Horovod-style API on the taiji group's peer.
--json prints the table as one JSON line.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import taiji.torch as hvd  # registers the "taiji" backend; the Horovod-style API


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--modes", default="gloo,taiji,hvd")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def data(rank, size):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)
    steps = (len(x_train) // size)
    return ((torch.from_numpy(x_train[rank::size][:steps]),
             torch.from_numpy(y_train[rank::size][:steps])),
            (torch.from_numpy(x_test), torch.from_numpy(y_test)))


def make_model(hidden):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def prepare(mode, model, args, gloo_group):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if mode == "hvd":
        # Averages as DDP does, so the three runs train alike.
        return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    group = gloo_group if mode == "gloo" else None
    return torch.nn.parallel.DistributedDataParallel(model, process_group=group), opt


def train(mode, args, shards, gloo_group):
    (x, y), (x_test, y_test) = shards
    model = make_model(args.hidden)
    net, opt = prepare(mode, model, args, gloo_group)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234 + dist.get_rank())
    steps = len(x) // args.batch_size
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            opt.zero_grad()
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return steps * args.epochs / elapsed, accuracy


def main():
    args = parse_args()
    torch.set_num_threads(1)  # 4 ranks share the cores; threads would fight
    dist.init_process_group("taiji")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo_group = dist.new_group(backend="gloo")
    hvd.init(peer=hvd.peer_of())  # one taiji job: the default group's
    shards = data(rank, size)
    modes = args.modes.split(",")
    rates = {m: [] for m in modes}
    accuracy = {}
    for _ in range(args.rounds):
        for mode in modes:
            rate, accuracy[mode] = train(mode, args, shards, gloo_group)
            rates[mode].append(rate)
    table = {m: {"steps_per_s": statistics.median(rates[m]), "accuracy": accuracy[m],
                 "rounds": rates[m]} for m in modes}
    base = table.get("gloo", {}).get("steps_per_s")
    if rank == 0:
        if args.json:
            print(json.dumps({"size": size, "epochs": args.epochs, "batch": args.batch_size,
                              "modes": table}), flush=True)
        else:
            print(f"{size} ranks, batch {args.batch_size}/rank, {args.epochs} epochs/round, "
                  f"median of {args.rounds} rounds", flush=True)
            names = {"gloo": "DDP over gloo", "taiji": "DDP over taiji",
                     "hvd": "taiji DistributedOptimizer"}
            for m in modes:
                ratio = f"{table[m]['steps_per_s'] / base:.2f}x" if base else "-"
                print(f"{names[m]:28s} {table[m]['steps_per_s']:8.1f} steps/s  {ratio:>6s}  "
                      f"accuracy {table[m]['accuracy']:.4f}", flush=True)
    hvd.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
