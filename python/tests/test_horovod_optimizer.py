"""broadcast_parameters, broadcast_optimizer_state and DistributedOptimizer: every rank
ends bitwise equal, and equal to a single-process replay of the same training."""
import subprocess

import pytest

from peers import LIBRARY, PYTHON, REPO


def _broadcast_state():
    import hashlib
    import torch
    import taiji.torch.horovod as hvd

    def digest(model, opt):
        h = hashlib.sha256()
        for k, v in sorted(model.state_dict().items()):
            h.update(k.encode() + v.numpy().tobytes())
        state = opt.state_dict()
        for pid, s in sorted(state["state"].items()):
            for k, v in sorted(s.items()):
                h.update(f"{pid}.{k}".encode())
                h.update(v.numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
        h.update(repr([{k: v for k, v in g.items() if k != "params"}
                       for g in state["param_groups"]]).encode())
        return h.hexdigest()

    def make(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4),
                                    torch.nn.ReLU(), torch.nn.Linear(4, 2))
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (seed + 1))
        return model, opt

    def train(model, opt, steps, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 5, generator=g)).square().sum().backward()
            opt.step()

    hvd.init()
    root = 1 % SIZE
    out = {}
    # Different weights, buffers, step counts (rank 0 has no optimizer state at all) and
    # learning rates on every rank.
    model, opt = make(RANK)
    train(model, opt, RANK, RANK)
    before = digest(model, opt)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    out["after"] = digest(model, opt)
    if RANK == root:
        assert out["after"] == before
    # They stay equal when training goes on with the same data.
    train(model, opt, 2, 99)
    out["trained"] = digest(model, opt)
    # The usual Horovod order: wrap first, then broadcast; numpy ints are ranks too.
    model, opt = make(20 + RANK)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=np.int64(root))
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    train(model, opt, 2, 7)
    out["wrapped"] = digest(model, opt)
    # named_parameters() and parameters() work too.
    for form in ("named", "plain"):
        m, o = make(10 + RANK)
        params = m.named_parameters() if form == "named" else m.parameters()
        hvd.broadcast_parameters(list(params), root_rank=0)
        out[form] = [p.detach().numpy().tobytes().hex() for p in m.parameters()]
    hvd.shutdown()
    emit(out)


@pytest.mark.parametrize("n", [2, 3])
def test_broadcast_parameters_and_optimizer_state_make_ranks_equal(run_peers, n):
    results = [r.results[0] for r in run_peers(_broadcast_state, n, timeout=90)]
    for key in ("after", "trained", "wrapped", "named", "plain"):
        assert all(r[key] == results[0][key] for r in results), key


def _distributed_optimizer():
    import hashlib
    import torch
    import taiji.torch.horovod as hvd

    hvd.init()

    def data(rank, step, micro):
        g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
        return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)

    def model():
        torch.manual_seed(7)
        net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        # "unused" never gets a gradient: it is reduced as zeros.
        return torch.nn.ModuleDict({"net": net, "unused": torch.nn.Linear(2, 2)})

    def loss(m, x, y):
        return (m["net"](x) - y).square().mean()

    def reference(steps, passes, combine, clip=None):
        """The same training in one process: every rank's gradients combined by hand."""
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for step in range(steps):
            grads = []
            for r in range(SIZE):
                opt.zero_grad()
                for k in range(passes):
                    loss(m, *data(r, step, k)).backward()
                grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone()
                              for p in m.parameters()])
            for i, p in enumerate(m.parameters()):
                p.grad = combine(torch.stack([g[i] for g in grads]))
            if clip:
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
            opt.step()
        return m

    def run(steps, passes=1, clip=None, **kwargs):
        m = model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=m.named_parameters(),
                                       backward_passes_per_step=passes, **kwargs)
        assert isinstance(opt, torch.optim.SGD)
        for step in range(steps):
            opt.zero_grad()
            for k in range(passes):
                loss(m, *data(RANK, step, k)).backward()
            if clip:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        return m

    def check(case, m, ref, tol):
        got = torch.cat([p.detach().flatten() for p in m.parameters()])
        want = torch.cat([p.detach().flatten() for p in ref.parameters()])
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=case)
        digests = hvd.allgather_object(hashlib.sha256(got.numpy().tobytes()).hexdigest())
        assert len(set(digests)) == 1, (case, "ranks differ")

    mean = lambda g: g.mean(0)  # noqa: E731
    check("average", run(3), reference(3, 1, mean), 1e-6)
    check("passes=2", run(3, passes=2), reference(3, 2, mean), 1e-6)
    check("per parameter", run(3, bucket_bytes=0), reference(3, 1, mean), 1e-6)
    check("per parameter, passes=2", run(2, passes=2, bucket_bytes=0),
          reference(2, 2, mean), 1e-6)
    check("small buckets, passes=2", run(3, passes=2, bucket_bytes=64),
          reference(3, 2, mean), 1e-6)
    check("sum, 2 groups", run(2, op=hvd.Sum, groups=2), reference(2, 1, lambda g: g.sum(0)),
          1e-6)
    check("clip", run(2, clip=0.05), reference(2, 1, mean, clip=0.05), 1e-6)
    check("predivide", run(2, gradient_predivide_factor=2.0), reference(2, 1, mean), 1e-6)
    check("fp16", run(2, compression=hvd.Compression.fp16), reference(2, 1, mean), 5e-3)
    check("bf16", run(2, compression=hvd.Compression.bf16), reference(2, 1, mean), 3e-2)

    # zero_grad between backward and step is refused, as in Horovod.
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    loss(m, *data(RANK, 0, 0)).backward()
    try:
        opt.zero_grad()
        raise AssertionError("zero_grad with allreduces in flight must raise")
    except AssertionError as e:
        assert "zero_grad" in str(e)
    opt.step()
    # Gradient statistics ride in the gradients' allreduces, committed once per step.
    stats = hvd.peer().grad_stats(batch_size=8)
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                                   named_parameters=m.named_parameters(), grad_stats=stats)
    for step in range(3):
        opt.zero_grad()
        loss(m, *data(RANK, step, 0)).backward()
        opt.step()
    read = stats.read()
    if SIZE > 1:
        assert read["steps"] == 3, read
        assert read["global_sq_norm"] > 0, read
    else:  # one rank: nothing to reduce, hence no hooks (as in Horovod), and no statistics
        assert read["state"] == "single_peer", read
    for bad in (dict(op=hvd.Adasum), dict(backward_passes_per_step=0),
                dict(op=hvd.Min, grad_stats=stats)):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=m.named_parameters(), **bad)
            raise AssertionError(f"{bad} should be refused")
        except (ValueError, NotImplementedError):
            pass
    stats.close()
    hvd.shutdown()
    emit("ok")


@pytest.mark.parametrize("n,fusion", [(1, "off"), (2, "off"), (3, "off"), (2, "on")])
def test_distributed_optimizer_matches_a_single_process_replay(run_peers, n, fusion):
    # With 2 ranks a sum has one addition, so the runtime's fusion cannot change its bits.
    results = run_peers(_distributed_optimizer, n, timeout=120, env={"TAIJI_FUSION": fusion})
    assert [r.results for r in results] == [["ok"]] * n


def test_example_reaches_its_accuracy_under_taiji_run():
    launcher = REPO / "build" / "tools" / "taiji-run"
    if not launcher.exists():
        pytest.skip("build/tools/taiji-run is not built")
    env = {"PYTHONPATH": str(REPO / "python"), "TAIJI_LIBRARY": LIBRARY, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [str(launcher), "--timeout", "100", "--no-tag", "-np", "4", PYTHON,
         str(REPO / "examples" / "horovod_digits.py"), "--epochs", "8", "--json",
         "--backward-passes", "2", "--batch-size", "8"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in lines) == [0, 1, 2, 3], proc.stdout
    assert all(r["same"] for r in lines), lines
    assert all(r["accuracy"] >= 0.9 for r in lines), lines
    assert len({r["accuracy"] for r in lines}) == 1, lines
