#!/usr/bin/python3
"""torch.distributed (gloo backend) peer for bench/compare/run.sh.

Measures like taiji-compare-gloo and taiji-compare-mpi (bench/compare/peer_common.h): f32
data, warm-up ops, then timed ops back to back; an iteration counts as long as it took on
the slowest rank and the row reports the median; CPU seconds are getrusage(RUSAGE_SELF)
user+sys over the timed loop, summed over ranks. all_reduce runs in place, so the timed
loop reduces data that sums to zero; afterwards the result and one more op on other data
are verified exactly. Rank 0 prints one JSON line per size.

Every rank runs it: torch_peer.py --rank R --world N --store FILE [--op allreduce] ...
(FILE: a fresh path on a filesystem every rank sees; torch's file:// rendezvous.
GLOO_SOCKET_IFNAME picks the interface, e.g. lo.)
"""
import argparse
import json
import resource
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # the driver turns this into "skipping the torch column"
    print(f"torch_peer.py: PyTorch is not installed ({e}); run bench/compare/install.sh",
          file=sys.stderr)
    sys.exit(3)


def parse_size(s):
    units = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gib": 1 << 30}
    digits = len(s) - len(s.lstrip("0123456789"))
    return int(s[:digits]) * units[s[digits:].lower()]


def cpu_seconds():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def base(count, seed):
    i = torch.arange(count, dtype=torch.int64)
    return ((i * 7 + seed * 13) % 61).to(torch.float32)


def run_size(args, rank, world, nbytes, iters):
    count = max(nbytes // 4, 1) if args.op != "barrier" else 1
    if args.op == "allreduce":
        buf = (2 * rank - world + 1) * (base(count, 1) + 1)  # sums to zero over ranks
        op = lambda: dist.all_reduce(buf)  # noqa: E731
    elif args.op == "broadcast":
        buf = base(count, 0) if rank == 0 else torch.full((count,), -1.0)
        op = lambda: dist.broadcast(buf, 0)  # noqa: E731
    else:
        buf = None
        op = dist.barrier
    for _ in range(args.warmup):
        op()
    dist.barrier()
    times = []
    cpu0 = cpu_seconds()
    refill_cpu = 0.0
    for i in range(iters):
        if 0 < i == iters - 1 and buf is not None:
            # The last timed op gets inputs whose sum is not zero (untimed, its CPU not
            # counted), so the check below reads what a timed op computed.
            c0 = cpu_seconds()
            if args.op == "allreduce":
                buf.copy_(base(count, 2) + rank + 1)
            else:
                buf.copy_(base(count, 0) if rank == 0 else torch.full((count,), -1.0))
            refill_cpu += cpu_seconds() - c0
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    cpu = cpu_seconds() - cpu0 - refill_cpu

    ok = True
    if args.op == "allreduce":
        if iters > 1:
            ok = bool(torch.equal(buf, world * base(count, 2) + world * (world + 1) // 2))
        else:
            ok = bool(torch.all(buf == 0))
        buf.copy_(base(count, 1) + rank + 1)
        op()
        ok = ok and bool(torch.equal(buf, world * base(count, 1) + world * (world + 1) // 2))
    elif args.op == "broadcast":
        ok = bool(torch.equal(buf, base(count, 0)))
        buf.copy_(base(count, 1) if rank == 0 else torch.full((count,), -1.0))
        op()
        ok = ok and bool(torch.equal(buf, base(count, 1)))
    if not ok:
        print(f"torch_peer.py: rank {rank}: wrong {args.op} result at {nbytes} bytes",
              file=sys.stderr)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    c = torch.tensor([cpu, 1.0 if ok else 0.0], dtype=torch.float64)
    dist.all_reduce(c)
    return t.tolist(), c[0].item(), c[1].item() == world


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", default="allreduce", choices=["allreduce", "broadcast", "barrier"])
    p.add_argument("-b", "--min-bytes", default="4")
    p.add_argument("-e", "--max-bytes", default="64M")
    p.add_argument("-f", "--step-factor", type=int, default=2)
    p.add_argument("--iters", type=int)
    p.add_argument("--iter-bytes", default="256M")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--label", default="torch")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="rendezvous file (fresh, shared)")
    args = p.parse_args()
    if args.iters:
        args.min_iters = args.max_iters = args.iters

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank,
                            world_size=args.world)
    sizes = [0]
    if args.op != "barrier":
        sizes, b = [], max(parse_size(args.min_bytes), 4)
        while b <= parse_size(args.max_bytes):
            sizes.append(b // 4 * 4)
            b *= args.step_factor
    all_ok = True
    iter_bytes = parse_size(args.iter_bytes)
    for nbytes in sizes:
        want = args.max_iters if nbytes == 0 else -(-iter_bytes // nbytes)
        iters = min(max(want, args.min_iters), args.max_iters)
        times, cpu, ok = run_size(args, args.rank, args.world, nbytes, iters)
        all_ok = all_ok and ok
        if args.rank != 0:
            continue
        t = statistics.median(times)
        row = {"impl": args.label, "algo": "gloo", "op": args.op, "dtype": "f32",
               "world_size": args.world, "size_bytes": nbytes, "iters": iters,
               "warmup": args.warmup, "time_us": round(t * 1e6, 3),
               "min_us": round(min(times) * 1e6, 3), "algbw_gbps": None, "busbw_gbps": None,
               "cpu_s": round(cpu, 6), "cpu_s_per_op": cpu / iters,
               "check": "-" if args.op == "barrier" else ("ok" if ok else "FAIL")}
        if args.op != "barrier":
            algbw = nbytes / t / 1e9
            row["algbw_gbps"] = algbw
            row["busbw_gbps"] = algbw * (2 * (args.world - 1) / args.world
                                         if args.op == "allreduce" else 1)
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
