"""Async ops, callbacks, groups, topologies, metrics, grad stats and the documented
errors, on real processes."""
import pytest


def async_and_features():
    import threading

    failures = []

    def expect(what, cond):
        if not cond:
            failures.append(what)

    with peer() as p:
        # Posted in a different order on every rank: matched by name, not order.
        names = [f"t{i}" for i in range(6)]
        order = names[RANK % 6:] + names[:RANK % 6]
        if RANK % 2:
            order.reverse()
        seen = []
        done = threading.Event()
        lock = threading.Lock()

        def note(req):
            with lock:
                seen.append((req.name, threading.current_thread().name, req.status))
                if len(seen) == len(names):
                    done.set()

        reqs = {n: p.allreduce_async(np.full(5, int(n[1:]) + RANK, np.int64), n,
                                     callback=note) for n in order}
        for n in names:
            got = reqs[n].wait(30)
            want = np.full(5, SIZE * int(n[1:]) + sum(range(SIZE)), np.int64)
            expect(f"async {n}: {got}", np.array_equal(got, want))
            expect(f"version {n}", reqs[n].version == 1 and reqs[n].test() and reqs[n].done)
        expect("callbacks ran", done.wait(10))
        expect(f"callbacks on the package thread: {seen}",
               all(t == "taiji-callbacks" and s == 0 for _, t, s in seen))
        late = threading.Event()
        reqs["t0"].add_done_callback(lambda r: late.set())
        expect("callback added after completion runs", late.wait(10))

        # wait(timeout) passing first is the builtin TimeoutError; the op goes on.
        if RANK == 0:
            r = p.barrier_async("late")
            try:
                r.wait(0.05)
                expect("wait(0.05) should time out", SIZE == 1)
            except TimeoutError as exc:
                expect("not an op error", not isinstance(exc, taiji.TaijiError) or SIZE == 1)
            p.barrier("go")
            expect("late completes", r.wait(30) is None)
        else:
            p.barrier("go")
            p.barrier("late")

        # Groups: ops held and handed over together; a blocking call inside is refused.
        x = np.arange(4, dtype=np.float32)
        with p.group():
            held = [p.allreduce_async(x, f"g{i}") for i in range(4)]
            try:
                p.allreduce(x, "blocking-in-group")
                expect("blocking call in a group must fail", False)
            except taiji.InvalidArgument as exc:
                expect("its message", "group" in str(exc))
        for r in held:
            expect("group result", np.array_equal(r.wait(30), x * SIZE))

        # Topologies: names, objects, back to automatic.
        p.set_topology("ring")
        r = p.allreduce_async(x, "on-ring")
        r.wait(30)
        ring = taiji.Topology.from_name("ring", peer=p)
        expect("ops run on the set topology", r.topology_digest == ring.digest)
        star = taiji.Topology.from_parents(SIZE, [[-1] + [0] * (SIZE - 1)],
                                           [[-1] + [0] * (SIZE - 1)])
        p.set_topology(star)
        r = p.allreduce_async(x, "on-star")
        expect("star result", np.array_equal(r.wait(30), x * SIZE))
        expect("ops run on the star", r.topology_digest == star.digest)
        p.set_topology(None)
        expect("per-op topology", np.array_equal(
            p.allreduce(x, "per-op", topology="ring"), x * SIZE))

        # Monitoring.
        p.step_mark()
        p.allreduce(x, "work")
        p.step_mark()
        m = p.metrics()
        expect("metrics schema", m["schema_version"] == 1 and m["rank"] == RANK
               and m["size"] == SIZE)
        expect("metrics counts", m["ops"]["allreduce"]["count"] >= 6 + 4 + 4)
        expect("steps", m["steps"]["count"] >= 1)
        fr = p.flight_recorder()
        expect("flight recorder", fr["schema_version"] == 1 and len(fr["ops"]) > 0)

        # Gradient statistics inside the allreduce.
        with p.grad_stats(batch_size=8, element_variance=True) as gs:
            grads = [np.arange(6, dtype=np.float32) * (r + 1) + r for r in range(SIZE)]
            mean = p.allreduce(grads[RANK].copy(), "grad", op=taiji.AVG, grad_stats=gs)
            gs.commit()
            stats = gs.read()
            ref_mean = np.mean(grads, axis=0, dtype=np.float64)
            expect("grad avg", np.allclose(mean, ref_mean, rtol=1e-6))
            s_local = np.mean([np.sum(np.square(g, dtype=np.float64)) for g in grads])
            s_global = np.sum(np.square(ref_mean))
            if SIZE > 1:  # one peer has no second batch size: nothing is estimated
                expect(f"local norm {stats}",
                       np.isclose(stats["local_sq_norm"], s_local, rtol=1e-6))
                expect(f"global norm {stats}",
                       np.isclose(stats["global_sq_norm"], s_global, rtol=1e-6))
                expect(f"steps {stats}", stats["steps"] == 1)
            expect(f"state {stats}", stats["state"] == ("single_peer" if SIZE == 1
                                                        else "defined"))
            var = np.mean(np.square(grads, dtype=np.float64), 0) - np.square(ref_mean)
            l2, total = gs.tensor_variance("grad")
            expect(f"variance {l2} {total}", np.isclose(l2, np.linalg.norm(var), rtol=1e-5,
                                                        atol=1e-9)
                   and np.isclose(total, var.sum(), rtol=1e-5, atol=1e-9))
            try:
                p.broadcast(x.copy(), "no-stats", 0, grad_stats=gs)
                expect("grad_stats on broadcast must be refused", False)
            except TypeError:
                pass
        p.barrier("end")
    emit(failures)


def errors():
    failures = []

    def expect(what, cond):
        if not cond:
            failures.append(what)

    with peer(timeout_ms=20000) as p:
        # Mismatch: different counts -> Mismatch on every rank, with the peer's text.
        try:
            p.allreduce(np.zeros(4 + (RANK == 1), np.float32), "mm")
            expect("mismatch not raised", False)
        except taiji.Mismatch as exc:
            expect(f"mismatch text {exc}", exc.status_name == "TAIJI_ERR_MISMATCH"
                   and len(exc.message) > 10)

        # Timeout: rank 1 never posts "lonely".
        if RANK != 1:
            r = p.allreduce_async(np.zeros(3, np.float32), "lonely", timeout_ms=500)
            try:
                r.wait(20)
                expect("timeout not raised", False)
            except taiji.Timeout as exc:
                expect(f"timeout names rank 1: {exc}", "1" in exc.message
                       and r.status == -3 and r.error == exc.message)
        p.barrier("after-timeout")

        # Bad arguments: Python errors before anything is posted.
        x = np.arange(8, dtype=np.float32)
        bad = [
            (TypeError, lambda: p.allreduce([1.0, 2.0], "bad")),
            (TypeError, lambda: p.allreduce(x[::2], "bad")),
            (ValueError, lambda: p.allreduce(x, "bad", out=np.zeros(7, np.float32))),
            (TypeError, lambda: p.allreduce(x, "bad", out=np.zeros(8, np.float64))),
            (TypeError, lambda: p.allreduce(x, 7)),
            (ValueError, lambda: p.allreduce(x, "")),
            (TypeError, lambda: p.allreduce(x, "bad", no_such_option=1)),
            (TypeError, lambda: p.allreduce(x, "bad", callback=print)),
            (ValueError, lambda: p.allreduce(x, "bad", op=9)),
            (TypeError, lambda: p.broadcast(x, "bad", root="0")),
            (ValueError, lambda: p.broadcast(np.arange(3).setflags(write=False) or
                                             _readonly(), "bad", 0)),
            (ValueError, lambda: p.reduce_scatter(np.zeros(SIZE * 2 + 1, np.int32), "bad")
             if SIZE > 1 else (_ for _ in ()).throw(ValueError())),
            (taiji.InvalidArgument, lambda: p.allreduce(x, "taiji.reserved")),
            (taiji.InvalidArgument, lambda: p.broadcast(x, "bad", root=SIZE)),
        ]
        for i, (cls, fn) in enumerate(bad):
            try:
                fn()
                expect(f"bad[{i}] not raised", False)
            except cls:
                pass
            except Exception as exc:
                expect(f"bad[{i}] raised {type(exc).__name__}: {exc}", False)
        r = p.allreduce_async(x, "bad")  # nothing was posted under "bad" before
        expect("first version of 'bad' is 1", r.version == 1)
        r.wait(20)

        # Duplicate and stale versions.
        r = p.allreduce_async(x, "v", version=5)
        try:
            p.allreduce_async(x, "v", version=5)
            expect("duplicate not raised", False)
        except taiji.Duplicate:
            pass
        r.wait(20)
        try:
            p.allreduce(x, "v", version=3)
            expect("stale not raised", False)
        except taiji.StaleVersion:
            pass
        p.barrier("end")
        expect("no async error", p.async_error() is None)
    try:
        p.allreduce(x, "after-close")
        expect("use after close not refused", False)
    except taiji.Finalized:
        pass
    emit(failures)


def _readonly():
    import numpy as np
    a = np.arange(3)
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("size", [1, 3])
def test_async_callbacks_groups_topologies_metrics_grad_stats(run_peers, size):
    for r in run_peers(async_and_features, size, timeout=90):
        assert r.results == [[]], f"rank {r.rank}: {r.results}\n{r.stderr}"


def test_errors_are_the_documented_exceptions(run_peers):
    import inspect
    body = inspect.getsource(_readonly) + inspect.getsource(errors) + "\nerrors()\n"
    for r in run_peers(body, 3, timeout=90):
        assert r.results == [[]], f"rank {r.rank}: {r.results}\n{r.stderr}"


def test_log_to_python(run_peers):
    body = """
import logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("taiji").addHandler(Keep())
logging.getLogger("taiji").setLevel(logging.DEBUG)
taiji.log_to_python(logging.DEBUG)
with peer() as p:
    p.allreduce(np.ones(3), "x")
import time
deadline = time.monotonic() + 10
while not records and time.monotonic() < deadline:
    time.sleep(0.01)
emit(len(records))
"""
    for r in run_peers(body, 2, timeout=60):
        assert r.results[0] > 0, r.stderr
        assert r.stderr == "" or "[taiji" not in r.stderr
