"""taiji's contract on device buffers, from Python, on one machine: N processes share the
GPU(s) and check, against taiji's host path on the same values:

  - every collective the device backend runs, for every dtype, bitwise (sum of small
    integers, so that the order of additions cannot change a float result);
  - named ops posted in a different order on every rank;
  - a disagreement (one rank's count differs) fails with Mismatch on every rank;
  - torch.distributed with the "taiji" backend: DDP on CUDA tensors keeps every rank's
    parameters equal;
  - kill -9 of one rank: the survivors' device op fails within its deadline.

    python3 bench/device/gpu_contract.py [--ranks N] [--cpu]

Every rank is a process of its own with NCCL_HOSTID=host<rank> (one GPU shared, as NCCL
allows it). --cpu runs the same checks on CPU tensors (the host path), to check the script
itself where there is no GPU. Exit: 0 all passed, 1 a check failed, 77 no GPU.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, size: int, device: str, phase: str) -> int:
    import torch
    import taiji
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    peer = taiji.Peer(timeout_ms=30000)
    failures = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    if phase == "kill":
        x = torch.ones(1024, device=dev)
        peer.allreduce(x, "before", out=x)
        if rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            peer.allreduce(x, "after", out=x, timeout_ms=5000)
            failures.append("an allreduce with a killed rank succeeded")
        except taiji.TaijiError as e:
            took = time.monotonic() - t0
            check(took < 5 + 5, f"the survivors' op failed after {took:.1f} s ({e.status_name})")
            print(f"[{rank}] kill: failed as it should in {took:.2f} s: {e.status_name}: {e}")
        peer.abort()
        return 1 if failures else 0

    # Every collective and dtype against the host path (bitwise).
    for dt in DTYPES:
        t = getattr(torch, dt)
        base = torch.arange(64, dtype=torch.int32).remainder(7).add(rank).to(t)
        for kind in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"):
            host_in, dev_in = base.clone(), base.clone().to(dev)
            name = f"{kind}.{dt}"
            if kind == "allreduce":
                want = peer.allreduce(host_in, "h." + name)
                got = peer.allreduce(dev_in, name)
            elif kind == "broadcast":
                want = peer.broadcast(host_in, "h." + name, root=size - 1)
                got = peer.broadcast(dev_in, name, root=size - 1)
            elif kind == "reduce":
                want = peer.reduce(host_in, "h." + name, root=0)
                got = peer.reduce(dev_in, name, root=0)
            elif kind == "allgather":
                want = peer.allgather(host_in, "h." + name)
                got = peer.allgather(dev_in, name)
            else:
                want = peer.reduce_scatter(host_in.repeat(size), "h." + name)
                got = peer.reduce_scatter(dev_in.repeat(size), name)
            if kind == "reduce" and rank != 0:
                continue
            check(torch.equal(got.cpu(), want), f"{name}: the device result differs from the host path")

    # Named ops in a different order on every rank.
    names = [f"grad.{i}" for i in range(16)]
    order = names[:]
    random.Random(rank).shuffle(order)
    bufs = {n: torch.full((1000 + i,), float(rank + 1), device=dev) for i, n in enumerate(names)}
    reqs = {n: peer.allreduce_async(bufs[n], n, out=bufs[n]) for n in order}
    for n in names:
        reqs[n].wait()
        check(bool((bufs[n] == size * (size + 1) / 2).all()), f"{n}: wrong sum")

    # A disagreement is a mismatch on every rank.
    x = torch.ones(8 if rank == 0 else 16, device=dev)
    try:
        peer.allreduce(x, "disagree", out=x)
        failures.append("a count mismatch succeeded")
    except taiji.Mismatch:
        pass
    after = peer.allreduce(torch.ones(4, device=dev), "after.mismatch")
    check(bool((after == size).all()), "the op after the mismatch")

    # DDP over the torch.distributed backend.
    import torch.distributed as dist
    import taiji.torch  # noqa: F401  (registers the backend)
    dist.init_process_group("taiji", rank=rank, world_size=size,
                            init_method=f"tcp://127.0.0.1:{os.environ['DDP_PORT']}")
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    for _ in range(5):
        opt.zero_grad()
        ddp(torch.randn(16, 32, device=dev)).square().mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(everyone, flat)
    check(all(torch.equal(everyone[0], f) for f in everyone), "DDP: the ranks' parameters differ")
    dist.destroy_process_group()

    for f in failures:
        print(f"[{rank}] FAILED: {f}")
    print(f"[{rank}] {'ok' if not failures else 'failed'}")
    peer.close()
    return 1 if failures else 0


def run(size: int, device: str, phase: str, timeout: float) -> int:
    port, ddp_port = free_port(), free_port()
    procs = []
    for r in range(size):
        env = dict(os.environ, TAIJI_RANK=str(r), TAIJI_WORLD_SIZE=str(size),
                   TAIJI_RENDEZVOUS=f"127.0.0.1:{port}", TAIJI_JOB_ID=f"contract-{phase}-{port}",
                   NCCL_HOSTID=f"host{r}", DDP_PORT=str(ddp_port))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(r), "--ranks", str(size),
                                       "--phase", phase] + (["--cpu"] if device == "cpu" else []), env=env))
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append("hung")
    if phase == "kill":
        ok = all(rc == 0 for rc in rcs[:-1]) and rcs[-1] == -signal.SIGKILL
    else:
        ok = all(rc == 0 for rc in rcs)
    print(f"{phase}, {size} ranks on {device}: {'ok' if ok else 'FAILED'} (exit codes {rcs})")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--worker", type=int)
    ap.add_argument("--phase", default="contract")
    a = ap.parse_args()
    device = "cpu" if a.cpu else "cuda"
    if a.worker is not None:
        return worker(a.worker, a.ranks, device, a.phase)
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("gpu_contract: no GPU here")
            return 77
    status = run(a.ranks, device, "contract", 300)
    return status | run(a.ranks, device, "kill", 120)


if __name__ == "__main__":
    sys.exit(main())
