"""Per-op cost of the Python layers over the C call: one allreduce of 4 B and of 1 MiB,
timed from Python through taiji.Peer, through torch.distributed over the "taiji" backend,
and through torch.distributed over gloo, side by side in one run.

    PYTHONPATH=python build/tools/taiji-run -np 2 /usr/bin/python3 bench/python/op_overhead.py

Compare with the same sizes from C (build/bench/taiji-bench, a loop of taiji_allreduce
calls) to read off what Python adds. Each number is the median over --rounds rounds of
the mean time of --iters back-to-back blocking allreduces (results checked).
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import taiji.torch  # registers the "taiji" backend


def timed(fn, iters, rounds):
    fn()
    per_op = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        per_op.append((time.perf_counter() - start) / iters)
    return statistics.median(per_op) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("taiji")
    size = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    peer = taiji.torch.peer_of()
    table = {}
    for label, count in (("4 B", 1), ("1 MiB", 1 << 18)):
        arr = np.ones(count, dtype=np.float32)
        ten = torch.ones(count)
        iters = args.iters if count == 1 else max(10, args.iters // 10)
        row = {
            "taiji.Peer (numpy)": timed(lambda: peer.allreduce(arr, "bench.np", out=arr),
                                        iters, args.rounds),
            "taiji.Peer (torch)": timed(lambda: peer.allreduce(ten, "bench.pt", out=ten),
                                        iters, args.rounds),
            "dist over taiji": timed(lambda: dist.all_reduce(ten), iters, args.rounds),
            "dist over gloo": timed(lambda: dist.all_reduce(ten, group=gloo), iters,
                                    args.rounds),
        }
        check = torch.ones(count)
        dist.all_reduce(check)
        assert check[0].item() == size, "allreduce gave a wrong sum"
        table[label] = row
    if dist.get_rank() == 0:
        if args.json:
            print(json.dumps({"size": size, "us_per_op": table}), flush=True)
        else:
            print(f"{size} ranks, median us per blocking allreduce", flush=True)
            for label, row in table.items():
                print(f"{label:6s} " + "  ".join(f"{k}: {v:8.1f}" for k, v in row.items()),
                      flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
