"""taiji.adapt: Python policies and built-ins decide the same on every rank."""
import pytest

import taiji
from taiji.adapt import Action, find_bsp_fraction


def _callback_agrees():
    from taiji.adapt import Action, Engine

    def policy(view):
        # Uses every rank's input: the sum is the same everywhere only if the view is.
        total = sum(view.inputs["loss"])
        if view.step == 0:
            return []
        return [Action("advise_batch", batch_scale=total, lr_scale=2.0,
                       reason=f"sum {total} median>0 {view.median_seconds > 0}")]

    with peer() as p:
        eng = Engine(p)
        eng.add(policy)
        log = []
        for step in range(4):
            eng.set_input("loss", RANK * 0.5 + step)
            for a in eng.step(samples=8 + RANK, timeout_ms=20000):
                log.append([step, a.kind, a.batch_scale, a.lr_scale, a.policy, a.reason,
                            a.applied])
        emit({"log": log, "mode": eng.sync_mode})
        eng.close()


def test_python_policy_agrees_on_every_rank(run_peers):
    results = run_peers(_callback_agrees, 3, timeout=60)
    logs = [r.results[0] for r in results]
    # sum over ranks of (0.5 r + step) = 1.5 + 3 step
    want = [[s, "advise_batch", 1.5 + 3 * s, 2.0, "callback", f"sum {1.5 + 3 * s} median>0 True",
             False] for s in range(1, 4)]
    for got in logs:
        assert got == {"log": want, "mode": "bsp"}


def _builtin_by_name():
    from taiji.adapt import Engine
    with peer() as p:
        eng = Engine(p)
        eng.add("sync_switch_offline", fraction=0.5, total_samples=64)
        eng.add("elastic", schedule={100: 4})
        seen = []
        for step in range(4):
            for a in eng.step(samples=8):
                seen.append([step, a.kind, a.mode, a.lr_scale, a.policy, a.reason])
        emit({"seen": seen, "mode": eng.sync_mode})
        eng.set_sync_mode("bsp")
        eng.reset()
        emit(eng.sync_mode)


def test_builtin_by_name_switches_on_every_rank(run_peers):
    results = run_peers(_builtin_by_name, 2, timeout=60)
    # 2 ranks x 8 samples a step: the 32nd sample (half of 64) is done at step 1.
    want = {"seen": [[1, "set_sync_mode", "pair", 1.0, "sync_switch_offline",
                      "32 of 64 samples done (fraction 0.5)"]], "mode": "pair"}
    for r in results:
        assert r.results == [want, "bsp"]


def _bad_specs():
    from taiji.adapt import Engine
    out = {}
    with peer() as p:
        eng = Engine(p)
        for name, call in [("unknown", lambda: eng.add("fastest")),
                           ("param", lambda: eng.add("sync_switch_online", q=1)),
                           ("value", lambda: eng.add("sync_switch_online", k="fast")),
                           ("mode", lambda: eng.set_sync_mode("fast"))]:
            try:
                call()
                out[name] = None
            except (taiji.TaijiError, ValueError) as e:
                out[name] = [type(e).__name__, getattr(e, "message", str(e))]

        def raises(view):
            raise RuntimeError("policy bug")
        eng.add(raises)
        try:
            eng.step(samples=1)
        except RuntimeError as e:
            out["raised"] = str(e)
        emit(out)


def test_bad_specs_raise_with_a_message(run_peers):
    [r] = run_peers(_bad_specs, 1, timeout=30)
    assert r.results == [{
        "unknown": ["InvalidArgument", "unknown policy 'fastest' (built-ins: sync_switch_offline, "
                    "sync_switch_online, adaptive_topology, batch_advice, elastic, measured_topology)"],
        "param": ["InvalidArgument", "sync_switch_online: unknown parameter 'q' (known: k, m, lr_rule)"],
        "value": ["InvalidArgument", "sync_switch_online: k 'fast' is not a number"],
        "mode": ["ValueError", "unknown sync mode 'fast' (one of bsp, sma, pair, local)"],
        "raised": "policy bug",
    }]


def test_find_bsp_fraction():
    assert find_bsp_fraction([], 0.9, 0.01, 0.125) == (0.5, False)
    assert find_bsp_fraction([(0.5, 0.9), (0.25, 0.8)], 0.9, 0.01, 0.125) == (0.375, False)
    assert find_bsp_fraction([(0.5, 0.9), (0.25, 0.8), (0.375, 0.85)], 0.9, 0.01, 0.125) == (0.5, True)
    with pytest.raises(ValueError):
        find_bsp_fraction([], 0.9, resolution=0)
    assert Action("resize", size=3).applied is False


def _mismatched_keys():
    from taiji.adapt import Engine
    with peer() as p:
        eng = Engine(p)
        eng.add(lambda view: [])
        eng.set_input("a" if RANK == 0 else "b", 1.0)
        try:
            eng.step(samples=1, timeout_ms=20000)
            emit("no error")
        except taiji.Mismatch as e:
            emit(e.message)
        eng.set_input("a", 1.0)
        emit(len(eng.step(samples=1, timeout_ms=20000)))


def test_mismatched_input_keys_fail_every_rank(run_peers):
    results = run_peers(_mismatched_keys, 2, timeout=60)
    for r in results:
        assert r.results == ["adapt step: rank 1 set other custom input keys than rank 0 (1 vs 1 keys); "
                             "every rank must set the same keys", 0]


def _elastic_schedule():
    import numpy as np
    from taiji.adapt import Engine
    p = peer()
    eng = Engine(p)
    eng.add("elastic", schedule={3: 2}, poll=0)
    log, detached = [], False
    for step in range(6):
        for a in eng.step(samples=8, timeout_ms=20000):
            log.append([step, a.kind, a.size, a.policy])
            if a.kind == "resize":
                # Every rank sees the action at the same step and applies it there; an
                # engine belongs to one membership, so the members start a new one.
                eng.close()
                changed, detached = p.resize(a.size, timeout_ms=20000)
                if detached:
                    break
                eng = Engine(p)
        if detached:
            break
        x = np.ones(4, np.float32)
        p.allreduce(x, f"after.{step}", out=x)
        log.append([step, "sum", int(x[0]), p.size])
    if not detached:
        eng.close()
    emit({"log": log, "detached": detached})
    p.close()


def test_elastic_schedule_resizes_every_rank_at_the_same_step(run_peers):
    results = [r.results[0] for r in run_peers(_elastic_schedule, 4, timeout=90)]
    resize = [3, "resize", 2, "elastic"]
    members = [[s, "sum", 4, 4] for s in range(3)] + [resize] + \
        [[s, "sum", 2, 2] for s in range(3, 6)]
    for rank, r in enumerate(results):
        if rank < 2:
            assert r == {"log": members, "detached": False}, (rank, r)
        else:
            assert r == {"log": [[s, "sum", 4, 4] for s in range(3)] + [resize],
                         "detached": True}, (rank, r)
