"""The Horovod-style functions of taiji.torch.horovod on 1-4 processes, against torch
references computed from every rank's known input."""
import pytest


def _collectives():
    # Runs on every rank (see peers.run_peers): RANK, SIZE, emit are defined.
    import time
    import torch
    import taiji.torch.horovod as hvd

    def same(a, b, what):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, a, b)
        assert torch.equal(a, b), (what, a, b)

    def inp(r, dtype, n=7):  # rank r's input: small integers, exact in every dtype
        return (torch.arange(n) * (r + 1) % 5 + r).to(dtype)

    hvd.init()
    hvd.init()  # a second init does nothing, as in Horovod
    assert (hvd.rank(), hvd.size()) == (RANK, SIZE)
    assert (hvd.local_rank(), hvd.local_size()) == (RANK, SIZE)
    inputs = {}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.int8, torch.uint8):
        stack = torch.stack([inp(r, dtype) for r in range(SIZE)])
        inputs[dtype] = stack
        mine = inp(RANK, dtype)
        wide = stack.double()
        refs = {hvd.Sum: wide.sum(0), hvd.Min: wide.min(0).values,
                hvd.Max: wide.max(0).values, hvd.Product: wide.prod(0)}
        for op, ref in refs.items():
            out = hvd.allreduce(mine, name=f"ar.{dtype}.{op.name}", op=op)
            same(out, ref.to(dtype), f"allreduce {dtype} {op}")
        avg = hvd.allreduce(mine, name=f"ar.{dtype}.avg")  # Average is the default
        if dtype.is_floating_point:
            ref = (wide.sum(0) / SIZE).to(dtype)
            torch.testing.assert_close(avg, ref)
        else:
            same(avg, torch.div(wide.sum(0), SIZE, rounding_mode="trunc").to(dtype), "avg")
        same(mine, inp(RANK, dtype), "allreduce leaves its input alone")

    x = inp(RANK, torch.float32)
    ref = inputs[torch.float32].sum(0)
    # In place, async, async in place; poll then synchronize.
    y = x.clone()
    assert hvd.allreduce_(y, name="inplace", op=hvd.Sum) is y
    same(y, ref, "allreduce_")
    h1 = hvd.allreduce_async(x, name="async", op=hvd.Sum)
    y = x.clone()
    h2 = hvd.allreduce_async_(y, name="async_", op=hvd.Sum)
    deadline = time.monotonic() + 30
    while not (hvd.poll(h1) and hvd.poll(h2)):
        assert time.monotonic() < deadline, "poll never saw the ops complete"
        time.sleep(0.001)
    same(hvd.synchronize(h1), ref, "allreduce_async")
    assert hvd.synchronize(h2) is y
    same(y, ref, "allreduce_async_")
    try:
        hvd.synchronize(h1)
        raise AssertionError("a synchronized handle must be forgotten")
    except ValueError:
        pass
    # Pre- and post-scaling, the deprecated average flag.
    same(hvd.allreduce(x, name="scaled", op=hvd.Sum, prescale_factor=2.0,
                       postscale_factor=0.5), ref, "scaled")
    same(hvd.allreduce(x, name="flag", average=False), ref, "average=False")
    # A non-contiguous tensor reduced in place.
    wide = torch.stack([x, x], 1)
    column = wide[:, 1]
    hvd.allreduce_(column, name="strided", op=hvd.Sum)
    same(wide[:, 1], ref, "strided in place")
    same(wide[:, 0], x, "strided neighbour untouched")
    # Compression: float16 and bfloat16 on the wire, the caller's dtype back.
    for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
        out = hvd.allreduce(x, name=f"comp.{comp.__name__}", op=hvd.Sum, compression=comp)
        same(out, ref, f"compression {comp.__name__}")
    same(hvd.allreduce(torch.arange(3) + RANK, name="comp.int", op=hvd.Sum,
                       compression=hvd.Compression.fp16),
         sum(torch.arange(3) + r for r in range(SIZE)), "compression leaves ints")
    # Unnamed ops meet by call order.
    for i in range(3):
        same(hvd.allreduce(x * i, op=hvd.Sum), ref * i, f"unnamed {i}")
    # ... whatever their shapes, also several in flight at once under one name.
    handles = [hvd.allreduce_async(torch.ones(i + 1) * (RANK + 1), op=hvd.Sum)
               for i in range(4)]
    for i, h in reversed(list(enumerate(handles))):
        same(hvd.synchronize(h), torch.full((i + 1,), SIZE * (SIZE + 1) / 2), "in flight")
    # Differentiable allreduce: d(sum_r allreduce(w))/dw = SIZE for Sum.
    w = x.clone().requires_grad_()
    hvd.allreduce(w, name="grad", op=hvd.Sum).sum().backward()
    same(w.grad, torch.full_like(x, float(SIZE)), "allreduce gradient")
    # Grouped allreduce, all four forms.
    ts = [x, x * 2, torch.arange(4, dtype=torch.int64) + RANK]
    refs = [ref, ref * 2, sum(torch.arange(4) + r for r in range(SIZE))]
    for got, want in zip(hvd.grouped_allreduce(ts, name="g", op=hvd.Sum), refs):
        same(got, want, "grouped_allreduce")
    copies = [t.clone() for t in ts]
    hvd.grouped_allreduce_(copies, name="g_", op=hvd.Sum)
    for got, want in zip(copies, refs):
        same(got, want, "grouped_allreduce_")
    h = hvd.grouped_allreduce_async(ts, name="ga", op=hvd.Sum)
    copies = [t.clone() for t in ts]
    h_ = hvd.grouped_allreduce_async_(copies, name="ga_", op=hvd.Sum)
    for got, want in zip(hvd.synchronize(h), refs):
        same(got, want, "grouped_allreduce_async")
    hvd.synchronize(h_)
    for got, want in zip(copies, refs):
        same(got, want, "grouped_allreduce_async_")
    # Broadcast: every form, every root.
    for root in range(SIZE):
        same(hvd.broadcast(x, root, name=f"b{root}"), inp(root, torch.float32), "broadcast")
        same(x, inp(RANK, torch.float32), "broadcast leaves its input alone")
        y = x.clone()
        assert hvd.broadcast_(y, root_rank=root, name=f"b_{root}") is y
        same(y, inp(root, torch.float32), "broadcast_")
        y = x.clone()
        hvd.synchronize(hvd.broadcast_async_(y, root, name=f"ba_{root}"))
        same(y, inp(root, torch.float32), "broadcast_async_")
        same(hvd.synchronize(hvd.broadcast_async(x, root)), inp(root, torch.float32),
             "broadcast_async unnamed")
    # allgather with different first dimensions, and of scalars.
    rows = torch.arange((RANK + 1) * 3, dtype=torch.float64).reshape(RANK + 1, 3) + RANK
    want = torch.cat([torch.arange((r + 1) * 3, dtype=torch.float64).reshape(r + 1, 3) + r
                      for r in range(SIZE)])
    same(hvd.allgather(rows, name="rows"), want, "allgather uneven")
    same(hvd.allgather(torch.tensor(RANK)), torch.arange(SIZE), "allgather scalars")
    # reduce_scatter: even and uneven rows, Sum and Average.
    for d in (2 * SIZE, 2 * SIZE + 1):
        t = torch.arange(d * 2, dtype=torch.float32).reshape(d, 2) * (RANK + 1)
        total = torch.arange(d * 2, dtype=torch.float32).reshape(d, 2) * sum(
            r + 1 for r in range(SIZE))
        counts = [d // SIZE + (1 if r < d % SIZE else 0) for r in range(SIZE)]
        start = sum(counts[:RANK])
        mine = total[start:start + counts[RANK]]
        same(hvd.reduce_scatter(t, name=f"rs{d}", op=hvd.Sum), mine, f"reduce_scatter {d}")
        torch.testing.assert_close(hvd.reducescatter(t, name=f"rsa{d}"), mine / SIZE)
    hvd.barrier()
    # Objects.
    obj = {"rank": RANK, "data": list(range(RANK))}
    assert hvd.broadcast_object(obj if RANK == SIZE - 1 else None, root_rank=SIZE - 1) == \
        {"rank": SIZE - 1, "data": list(range(SIZE - 1))}
    assert hvd.allgather_object(obj, name="objs") == [
        {"rank": r, "data": list(range(r))} for r in range(SIZE)]
    # taiji's own: a topology switch, then ops on it.
    hvd.set_topology("ring")
    same(hvd.allreduce(x, name="after-ring", op=hvd.Sum), ref, "after set_topology")
    hvd.set_topology(None)
    # Clear errors for what is not supported.
    for bad in (lambda: hvd.allreduce(x, op=hvd.Adasum),
                lambda: hvd.allreduce(x, process_set=object()),
                lambda: hvd.init(comm=[0, 1])):
        try:
            bad()
            raise AssertionError("should have raised")
        except NotImplementedError:
            pass
    try:
        hvd.allreduce([1.0, 2.0])
        raise AssertionError("a list is not a tensor")
    except TypeError:
        pass
    hvd.shutdown()
    hvd.shutdown()
    assert not hvd.is_initialized()
    emit("ok")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_function_against_torch(run_peers, n):
    results = run_peers(_collectives, n, timeout=90)
    assert [r.results for r in results] == [["ok"]] * n


def _errors():
    import time
    import torch
    import taiji
    import taiji.torch.horovod as hvd

    try:
        hvd.rank()
        raise AssertionError("rank() before init must raise")
    except ValueError as e:
        assert "init" in str(e)
    hvd.init(timeout_ms=3000)
    caught = []
    # Ranks disagree on the shape: every rank gets Mismatch, naming the op.
    try:
        hvd.allreduce(torch.zeros(3 + RANK), name="shape")
    except hvd.HorovodInternalError as e:
        assert isinstance(e, taiji.Mismatch), e
        assert "allreduce.shape" in str(e), str(e)
        caught.append("mismatch")
    # An async op whose peers never post: its synchronize raises Timeout on rank 0.
    if RANK == 0:
        h = hvd.allreduce_async(torch.ones(2), name="lonely")
        try:
            hvd.synchronize(h)
        except taiji.Timeout as e:
            assert "lonely" in str(e), str(e)
            caught.append("timeout")
    else:
        # Meet rank 0 after its 3 s timeout, with time to spare on this barrier's own.
        time.sleep(1.5)
    hvd.barrier()
    # The peer still works afterwards.
    out = hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(SIZE)))
    hvd.shutdown()
    emit(caught)


def test_errors_are_raised_on_every_rank(run_peers):
    results = run_peers(_errors, 2, timeout=60)
    assert [r.results for r in results] == [[["mismatch", "timeout"]], [["mismatch"]]]


_TORCHRUN_BODY = """
import os, sys
import torch
import taiji.torch.horovod as hvd
hvd.init()
assert (hvd.rank(), hvd.size()) == (int(os.environ["RANK"]), 2)
assert (hvd.local_rank(), hvd.local_size()) == (int(os.environ["LOCAL_RANK"]), 2)
out = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), name="x", op=hvd.Sum)
assert out.item() == 3.0, out
hvd.shutdown()
print("ok")
"""


def test_init_reads_torchrun_variables(tmp_path):
    import os
    import subprocess
    from peers import LIBRARY, PYTHON, REPO, free_master_port

    script = tmp_path / "body.py"
    script.write_text(_TORCHRUN_BODY)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAIJI_")}
    base.update({"PYTHONPATH": str(REPO / "python"), "TAIJI_LIBRARY": LIBRARY,
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_master_port()),
                 "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "TAIJI_JOB_ID": f"hvd-torchrun-{os.getpid()}"})
    procs = [subprocess.Popen([PYTHON, str(script)], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(2)]
    try:
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [o.split() for o in outputs] == [["ok"], ["ok"]], outputs
