"""The torch.distributed backend "taiji": DDP, new_group, comm hooks, PostLocalSGD and
PeriodicModelAverager, every collective torch forwards, and errors; checked against the
same run over gloo in the same processes."""
import math

import pytest

from peers import free_port


def _ddp_checks():
    import datetime
    import hashlib
    import math
    import time
    import torch
    import torch.distributed as dist
    import taiji.torch  # noqa: F401  (registers the "taiji" backend)
    from taiji.torch import hooks

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 4))

    def train(group=None, hook=None, state=None, steps=6):
        m = model()
        ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=group,
                                                        bucket_cap_mb=0.001)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(100 + RANK)
        for _ in range(steps):
            opt.zero_grad()
            x = torch.randn(16, 12, generator=g)
            ddp(x).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in m.parameters()]

    def digest(params):
        return hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()

    out = {}
    dist.init_process_group("taiji")
    assert dist.get_backend() == "taiji" and dist.get_rank() == RANK
    assert dist.get_world_size() == SIZE
    plain = train()
    out["ddp"] = digest(plain)
    out["ddp_values"] = [p.reshape(-1).tolist() for p in plain]
    out["hook"] = digest(train(hook=hooks.allreduce_hook))
    state = hooks.GradStatsState(batch_size=16)
    out["stats_digest"] = digest(train(hook=hooks.grad_stats_hook, state=state))
    out["stats"] = {k: state.stats.get(k) for k in ("noise_scale", "snr", "steps")}

    # Every collective torch forwards, against what it must give.
    t = torch.arange(4, dtype=torch.float32) + RANK
    dist.all_reduce(t)
    assert t.tolist() == [sum(range(SIZE)) + i * SIZE for i in range(4)]
    for op, value, expect in ((dist.ReduceOp.MAX, RANK, SIZE - 1),
                              (dist.ReduceOp.MIN, RANK, 0),
                              (dist.ReduceOp.PRODUCT, RANK + 1, math.factorial(SIZE))):
        v = torch.full((3,), float(value))
        dist.all_reduce(v, op=op)
        assert v.tolist() == [float(expect)] * 3, (op, v)
    v = torch.full((5,), float(RANK * 2), dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.AVG)
    assert v.tolist() == [float(SIZE - 1)] * 5
    for half in (torch.float16, torch.bfloat16):  # exact: small integers
        h = torch.full((4,), float(RANK + 1), dtype=half)
        dist.all_reduce(h)
        assert h.dtype == half and h.tolist() == [SIZE * (SIZE + 1) / 2] * 4
    i64 = torch.full((2,), RANK + 1, dtype=torch.int64)
    dist.all_reduce(i64)
    assert i64.tolist() == [SIZE * (SIZE + 1) // 2] * 2
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
        raise AssertionError("BAND was accepted")
    except ValueError as exc:
        assert "not supported" in str(exc)
    b = torch.full((6,), float(RANK))
    dist.broadcast(b, src=SIZE - 1)
    assert b.tolist() == [float(SIZE - 1)] * 6
    nc = torch.zeros(4, 3)[:, 1]  # not contiguous: staged and copied back
    nc += RANK + 1
    dist.all_reduce(nc)
    assert nc.tolist() == [SIZE * (SIZE + 1) / 2] * 4
    r = torch.full((3,), float(RANK + 1))
    dist.reduce(r, dst=0)
    if RANK == 0:
        assert r.tolist() == [SIZE * (SIZE + 1) / 2] * 3
    gathered = [torch.zeros(2) for _ in range(SIZE)]
    dist.all_gather(gathered, torch.full((2,), float(RANK)))
    assert [x.tolist() for x in gathered] == [[float(k)] * 2 for k in range(SIZE)]
    flat = torch.zeros(SIZE * 2)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(RANK)))
    assert flat.tolist() == [float(k) for k in range(SIZE) for _ in range(2)]
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(k + RANK)) for k in range(SIZE)])
    assert rs.tolist() == [float(SIZE * RANK + sum(range(SIZE)))] * 2
    objs = [None] * SIZE
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": k} for k in range(SIZE)]
    w = dist.all_reduce(torch.ones(2), async_op=True)
    assert w.wait(datetime.timedelta(seconds=30))
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    assert fut.then(lambda f: f.value()[0].sum().item()).wait() == 3 * SIZE
    dist.barrier()

    # A subgroup: its own taiji job, bootstrapped through torch's store.
    sub = dist.new_group([0, 1])
    if RANK < 2:
        s = torch.full((2,), float(RANK + 1))
        dist.all_reduce(s, group=sub)
        assert s.tolist() == [3.0, 3.0]
        out["sub"] = digest(train(group=sub))
    odd = dist.new_group([r for r in range(SIZE) if r % 2 == 1])
    if RANK % 2 == 1:
        s = torch.ones(1)
        dist.all_reduce(s, group=odd)
        assert s.item() == len([r for r in range(SIZE) if r % 2 == 1])

    # PostLocalSGD and PeriodicModelAverager over the taiji group.
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pls
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer
    m = model()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    # Local SGD within pairs of ranks (torch's default subgroups need CUDA).
    pairs = [dist.new_group([i, i + 1]) for i in range(0, SIZE, 2)]
    ddp.register_comm_hook(pls.PostLocalSGDState(process_group=None,
                                                 subgroup=pairs[RANK // 2],
                                                 start_localSGD_iter=2),
                           pls.post_localSGD_hook)
    opt = PostLocalSGDOptimizer(optim=torch.optim.SGD(ddp.parameters(), lr=0.05),
                                averager=averagers.PeriodicModelAverager(period=2,
                                                                         warmup_steps=2))
    g = torch.Generator().manual_seed(7 + RANK)
    for _ in range(7):  # averaged after steps 2, 4 and 6, the last
        opt.zero_grad()
        ddp(torch.randn(8, 12, generator=g)).square().mean().backward()
        opt.step()
    out["local_sgd"] = digest([p.detach() for p in m.parameters()])
    m2 = model()
    averager = averagers.PeriodicModelAverager(period=3, warmup_steps=0)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.05)
    for step in range(4):  # averaged at steps 0 and 3, the last
        opt2.zero_grad()
        m2(torch.randn(8, 12, generator=g)).square().mean().backward()
        opt2.step()
        averager.average_parameters(m2.parameters())
    out["averager"] = digest([p.detach() for p in m2.parameters()])

    # A mismatched collective raises on every rank, and the group stays usable.
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(3 + (RANK == 0)))
        out["mismatch"] = "no error"
    except Exception as exc:
        out["mismatch"] = type(exc).__name__
        out["mismatch_text"] = str(exc)
    out["mismatch_s"] = time.monotonic() - start
    after = torch.ones(2)
    dist.all_reduce(after)
    assert after.tolist() == [float(SIZE)] * 2
    dist.destroy_process_group()

    # The same DDP run over gloo in the same processes.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ARGS['port']}",
                            rank=RANK, world_size=SIZE)
    gloo = train()
    out["gloo_values"] = [p.reshape(-1).tolist() for p in gloo]
    dist.destroy_process_group()
    emit(out)


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_and_collectives_match_gloo(run_peers, n):
    results = [r.results[0] for r in run_peers(_ddp_checks, n, timeout=150,
                                                args={"port": free_port()})]
    first = results[0]
    for key in ("ddp", "hook", "stats_digest", "local_sgd", "averager"):
        assert {r[key] for r in results} == {first[key]}, key  # bitwise equal on every rank
    assert {r["sub"] for r in results[:2]} == {first["sub"]}
    for mine, theirs in zip(first["ddp_values"], first["gloo_values"]):
        assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    stats = first["stats"]
    assert stats["steps"] == 6
    assert math.isfinite(stats["noise_scale"]) and math.isfinite(stats["snr"]), stats
    for r in results:
        assert r["mismatch"] == "Mismatch", r.get("mismatch_text")
        assert r["mismatch_s"] < 30


def _timeout_case():
    import datetime
    import time
    import torch
    import torch.distributed as dist
    import taiji
    import taiji.torch  # noqa: F401  (registers the "taiji" backend)
    dist.init_process_group("taiji", timeout=datetime.timedelta(seconds=3))
    out = {}
    if RANK == 0:  # rank 1 never posts this one
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2))
            out["error"] = None
        except taiji.Timeout as exc:
            out["error"], out["text"] = "Timeout", str(exc)
        out["seconds"] = time.monotonic() - start
        w = dist.broadcast(torch.ones(1), src=0, async_op=True)  # the async path too
        try:
            w.wait()
        except taiji.Timeout:
            out["async"] = "Timeout"
    else:
        time.sleep(7)
    dist.barrier()  # the group is still usable
    emit(out)
    dist.destroy_process_group()


def test_a_rank_that_never_posts_times_out(run_peers):
    first = run_peers(_timeout_case, 2, timeout=60)[0].results[0]  # rank 0's view
    assert first["error"] == "Timeout", first
    assert "rank(s) 1" in first["text"], first["text"]
    assert 2.5 < first["seconds"] < 20
    assert first["async"] == "Timeout"
