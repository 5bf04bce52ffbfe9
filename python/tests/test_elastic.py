"""Elastic membership from Python: Peer.resize/shrink and the versions through
``taiji-run --elastic``, and taiji.torch.elastic training that grows and shrinks and ends
as accurate as a run of fixed size."""
import json
import os
import pathlib
import subprocess
import tempfile
import textwrap

import pytest

from peers import LIBRARY, PYTHON, REPO

LAUNCHER = REPO / "build" / "tools" / "taiji-run"
_MARK = "@@elastic@@ "


def _launch(args, timeout):
    if not LAUNCHER.exists():
        pytest.skip("build/tools/taiji-run is not built")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TAIJI_LIBRARY=LIBRARY)
    try:
        return subprocess.run([str(LAUNCHER), "--no-tag", "--timeout", str(timeout - 10)] + args,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"taiji-run {' '.join(args)} still running after {timeout} s\n"
                             f"--- stdout\n{e.stdout}\n--- stderr\n{e.stderr}") from None


def _single():
    # One process: a resize to its own size changes nothing, the versions are the first,
    # and a symbol the library lacks is Unsupported, not a crash at import.
    from taiji import _lib
    with peer() as p:
        out = {"resize": list(p.resize(1)), "cluster": p.cluster_version,
               "joined": p.joined_version, "requested": p.requested_size(),
               "rank": p.rank, "size": p.size}
        _lib._LATE_SIGNATURES["taiji_no_such_function"] = (None, [])
        try:
            p._elastic("taiji_no_such_function")
        except taiji.Unsupported as e:
            out["missing"] = e.status_name
        try:
            p.resize(0)
        except taiji.TaijiError as e:
            out["zero"] = type(e).__name__
    emit(out)


def test_resize_to_the_same_size_changes_nothing(run_peers):
    [result] = run_peers(_single, 1, timeout=30)
    assert result.results == [{"resize": [False, False], "cluster": 1, "joined": 1,
                               "requested": 0, "rank": 0, "size": 1,
                               "missing": "TAIJI_ERR_UNSUPPORTED",
                               "zero": "InvalidArgument"}]


# Runs under taiji-run -np 4 --elastic; every line it emits names the process (pid).
_MEMBERSHIP = '''
import json, os, subprocess, sys, time
import numpy as np
import taiji

LAUNCHER = sys.argv[1]
p = taiji.Peer(timeout_ms=20000)


def emit(stage, **kw):
    kw.update(stage=stage, pid=os.getpid(), rank=p.rank, size=p.size,
              cluster=p.cluster_version, joined=p.joined_version)
    print("@@elastic@@ " + json.dumps(kw), flush=True)


def rank_sum():
    return int(p.allreduce(np.array([p.rank], np.int64), "ranks")[0])


if p.joined_version == 1:
    emit("start", requested=p.requested_size())
    emit("same", result=list(p.resize(4)))
    try:
        p.resize(3 if p.rank == 0 else 2)
        emit("mismatch", error=None)
    except taiji.Mismatch as e:
        emit("mismatch", error=type(e).__name__)
    old = p.rank
    changed, detached = p.resize(3)
    emit("shrink", old=old, changed=changed, detached=detached)
    if detached:
        p.close()
        sys.exit(0)
    emit("shrunk", sum=rank_sum())
    old = p.rank
    changed, detached = p.resize(5)  # taiji-run starts ranks 3 and 4
    state = np.array([4242 if p.rank == 0 else 0], np.int64)
    p.broadcast(state, "state", 0)
    emit("grow", old=old, changed=changed, detached=detached, state=int(state[0]))
else:
    state = np.zeros(1, np.int64)
    p.broadcast(state, "state", 0)  # what the members post right after the resize
    emit("joined", state=int(state[0]))
emit("grown", sum=rank_sum())

# An operator's request, through the store, agreed on as rank 0 read it.
if p.rank == 0:
    subprocess.run([LAUNCHER, "--resize", "3", "--store", os.environ["TAIJI_RENDEZVOUS"],
                    "--job-id", os.environ["TAIJI_JOB_ID"]], check=True, timeout=30)
p.barrier("asked")
wanted = np.array([p.requested_size() if p.rank == 0 else 0], np.int64)
p.broadcast(wanted, "wanted", 0)
changed, detached = p.resize(int(wanted[0]))
if detached:
    emit("applied", wanted=int(wanted[0]), changed=changed, detached=detached)
    p.close()
    sys.exit(0)
# The request is used up before any member returns from the resize that applied it.
emit("applied", wanted=int(wanted[0]), changed=changed, detached=detached,
     requested=p.requested_size())

# A lost rank: rank 2 dies without closing; the survivors shrink and go on.
if p.rank == 2:
    time.sleep(1)  # the others' last op with it is done
    os._exit(17)
try:
    p.allreduce(np.ones(1), "after.loss")
    error = None
except taiji.TaijiError as e:
    error = type(e).__name__
sticky = type(p.async_error()).__name__
old = p.rank
changed = p.shrink()
emit("lost", old=old, error=error, sticky=sticky, changed=changed, sum=rank_sum())
p.close()
'''


def _stages(stdout):
    lines = [json.loads(line[len(_MARK):]) for line in stdout.splitlines()
             if line.startswith(_MARK)]
    by = {}
    for line in lines:
        by.setdefault(line["stage"], []).append(line)
    for items in by.values():
        items.sort(key=lambda x: x["rank"])
    return by


def test_peer_resize_shrink_and_versions_under_taiji_run_elastic():
    with tempfile.TemporaryDirectory(prefix="taiji-elastic-") as tmp:
        script = pathlib.Path(tmp) / "membership.py"
        script.write_text(textwrap.dedent(_MEMBERSHIP))
        proc = _launch(["-np", "4", "--elastic", "--min-np", "1", "--max-np", "5", PYTHON,
                        str(script), str(LAUNCHER)], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    s = _stages(proc.stdout)
    first = {x["pid"] for x in s["start"]}
    assert [(x["rank"], x["size"], x["cluster"], x["joined"], x["requested"])
            for x in s["start"]] == [(r, 4, 1, 1, 0) for r in range(4)], out
    assert [x["result"] for x in s["same"]] == [[False, False]] * 4, out
    # Proposals that differ fail on every member and change nothing.
    assert [(x["error"], x["size"], x["cluster"]) for x in s["mismatch"]] == \
        [("Mismatch", 4, 1)] * 4, out
    # 4 -> 3: rank 3 is detached, the others keep their rank.
    shrink = sorted(s["shrink"], key=lambda x: x["old"])
    assert [(x["old"], x["changed"], x["detached"]) for x in shrink] == \
        [(0, True, False), (1, True, False), (2, True, False), (3, True, True)], out
    assert [x["rank"] for x in shrink[:3]] == [0, 1, 2], out
    assert [(x["size"], x["cluster"], x["sum"]) for x in s["shrunk"]] == [(3, 2, 3)] * 3, out
    # 3 -> 5: the members keep their ranks; taiji-run started ranks 3 and 4, which joined at
    # version 3 and got rank 0's state by the broadcast.
    assert [(x["old"], x["rank"], x["size"], x["cluster"], x["changed"], x["state"])
            for x in s["grow"]] == [(r, r, 5, 3, True, 4242) for r in range(3)], out
    assert [(x["rank"], x["size"], x["cluster"], x["joined"], x["state"])
            for x in s["joined"]] == [(3, 5, 3, 3, 4242), (4, 5, 3, 3, 4242)], out
    assert not first & {x["pid"] for x in s["joined"]}, out
    assert [(x["size"], x["sum"]) for x in s["grown"]] == [(5, 10)] * 5, out
    # taiji-run --resize 3: every rank took rank 0's 3, ranks 3 and 4 left, and the request
    # was used up when each member's resize returned.
    applied = s["applied"]
    assert [x["wanted"] for x in applied] == [3] * 5, out
    assert [(x["rank"], x["detached"]) for x in applied if x["detached"]] == \
        [(3, True), (4, True)], out
    assert [(x["rank"], x["size"], x["cluster"], x["changed"], x["requested"])
            for x in applied if not x["detached"]] == [(r, 3, 4, True, 0) for r in range(3)], out
    # Rank 2 lost: the survivors' op fails with PeerLost, shrink renumbers them 0, 1.
    lost = s["lost"]
    assert [(x["old"], x["rank"], x["size"], x["cluster"], x["changed"], x["sum"])
            for x in lost] == [(0, 0, 2, 5, True, 1), (1, 1, 2, 5, True, 1)], out
    assert all("PeerLost" in (x["error"], x["sticky"]) for x in lost), out


def _digits(args, np_, elastic):
    cmd = ["-np", str(np_)]
    if elastic:
        cmd += ["--elastic", "--min-np", "2", "--max-np", "4"]
    proc = _launch(cmd + [PYTHON, str(REPO / "examples" / "elastic_digits.py"), "--json"]
                   + args, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return lines, proc.stdout + proc.stderr


def test_elastic_training_grows_and_shrinks_to_the_fixed_size_accuracy():
    fixed, out = _digits([], 2, elastic=False)
    assert sorted(r["rank"] for r in fixed) == [0, 1], out
    assert all(r["same"] and r["steps"] == 210 for r in fixed), out
    reference = fixed[0]["accuracy"]
    assert reference >= 0.9 and all(r["accuracy"] == reference for r in fixed), out

    # 2 -> 4 after step 60, 4 -> 2 after step 140, asked through taiji-run --resize.
    lines, out = _digits(["--request", "60:4", "--request", "140:2"], 2, elastic=True)
    final = sorted((r for r in lines if not r.get("detached")), key=lambda r: r["rank"])
    detached = [r for r in lines if r.get("detached")]
    assert [(r["rank"], r["size"], r["joined_version"], r["cluster_version"]) for r in final] \
        == [(0, 2, 1, 3), (1, 2, 1, 3)], out
    assert all(r["sizes"] == [[0, 2], [60, 4], [140, 2]] for r in final), out
    assert all(r["same"] and r["steps"] == 210 for r in final), out
    # The two ranks that joined at step 60 left at step 140.
    assert [r["step"] for r in detached] == [140, 140], out
    accuracy = final[0]["accuracy"]
    assert final[1]["accuracy"] == accuracy, out
    assert abs(accuracy - reference) <= 0.02, (accuracy, reference, out)


# Runs under taiji-run -np 3 --elastic: the rank 2 of the first membership dies in step 25;
# the survivors shrink, go back to the commit after step 24 and finish on two ranks.
_LOSS = '''
import json, os, sys
import torch
import taiji.torch as hvd
from taiji.torch import elastic

STEPS, BATCH = 40, 12
g = torch.Generator().manual_seed(5)
X, W = torch.randn(240, 4, generator=g), torch.randn(4, 1, generator=g)
Y = X @ W


def batch(step, rank, size):
    rows = torch.arange(step * BATCH, (step + 1) * BATCH) % len(X)
    return X[rows][rank::size], Y[rows][rank::size]


def reference():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, 0, 1)
        (model(x) - y).square().mean().backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


hvd.init()
torch.manual_seed(hvd.rank())  # different on purpose: the sync makes them rank 0's
model = torch.nn.Linear(4, 1)
if hvd.rank() == 0:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                               named_parameters=model.named_parameters())
state = elastic.State(model, opt, step=0, entries=[])
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
doomed = hvd.rank() == 2


@elastic.run
def train(state):
    state.entries.append((state.step, hvd.size()))
    while state.step < STEPS:
        opt.zero_grad()
        if doomed and state.step == 25:
            os._exit(17)
        x, y = batch(state.step, hvd.rank(), hvd.size())
        (model(x) - y).square().mean().backward()
        opt.step()
        state.step += 1
        state.commit()
    return "done"


result = train(state)
got = torch.cat([p.detach().flatten() for p in model.parameters()])
digests = hvd.allgather_object(got.numpy().tobytes().hex())
print("@@elastic@@ " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "result": result, "entries": state.entries,
    "resets": resets, "same": len(set(digests)) == 1, "step": state.step,
    "local": [hvd.local_rank(), hvd.local_size()],
    "error": float((got - reference()).abs().max())}), flush=True)
hvd.shutdown()
'''


def test_elastic_run_survives_a_lost_rank():
    with tempfile.TemporaryDirectory(prefix="taiji-elastic-") as tmp:
        script = pathlib.Path(tmp) / "loss.py"
        script.write_text(textwrap.dedent(_LOSS))
        proc = _launch(["-np", "3", "--elastic", "--min-np", "2", PYTHON, str(script)],
                       timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    lines = sorted((json.loads(line[len(_MARK):]) for line in proc.stdout.splitlines()
                    if line.startswith(_MARK)), key=lambda x: x["rank"])
    assert [(x["rank"], x["size"], x["result"], x["step"], x["same"]) for x in lines] == \
        [(0, 2, "done", 40, True), (1, 2, "done", 40, True)], out
    # Entered on three ranks, again at the last commit on two; the reset callbacks ran once.
    assert all(x["entries"] == [[0, 3], [25, 2]] and x["resets"] == [2] for x in lines), out
    # taiji-run said 3 local ranks at the start; they are counted again after the change.
    assert [x["local"] for x in lines] == [[0, 2], [1, 2]], out
    # The mean gradient over a global batch does not depend on the size: the result is a
    # one-process run's, up to rounding.
    assert all(x["error"] < 1e-5 for x in lines), out
