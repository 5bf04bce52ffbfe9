"""The model store from Python, on real peers: saves of every buffer kind, one-sided
fetches while the owner computes, the documented errors, and a fetch from a rank killed
with SIGKILL."""
import taiji


def fetch_while_busy():
    import time
    import torch
    failures = []
    p = peer()
    w = np.arange(100000, dtype=np.float32) + 1000 * RANK
    if p.model_save("w", w) != 1:
        failures.append("first save is not version 1")
    w2 = torch.arange(100000, dtype=torch.float32) + 1000 * RANK + 0.5
    if p.model_save("w", w2) != 2:
        failures.append("second save is not version 2")
    if p.model_save("raw", bytes(range(256)) * 4, version=7) != 7:
        failures.append("explicit version 7 not kept")
    p.barrier("saved")
    if RANK == 0:
        # Away from taiji while every other rank fetches: sleeping, then spinning.
        time.sleep(1.0)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
    else:
        started = time.monotonic()
        got = p.model_request(0, "w", np.empty(100000, np.float32))
        if not np.array_equal(got, torch.arange(100000, dtype=torch.float32).numpy() + 0.5):
            failures.append("latest from rank 0 differs")
        first = torch.empty(100000, dtype=torch.float32)
        req = p.model_request_async(0, "w", first, version=1, timeout_ms=10000)
        if req.wait(20) is not first or not torch.equal(first, torch.arange(100000, dtype=torch.float32)):
            failures.append("version 1 from rank 0 differs")
        raw = bytearray(1024)
        p.model_request(0, "raw", raw)
        if bytes(raw) != bytes(range(256)) * 4:
            failures.append("bytes from rank 0 differ")
        if time.monotonic() - started > 1.0:
            failures.append("the fetches waited for rank 0's caller")
        try:
            p.model_request(0, "nothing", bytearray(4))
            failures.append("a missing name did not raise")
        except taiji.NotFoundError as e:
            if "no model 'nothing' was saved" not in str(e):
                failures.append("NotFoundError text: " + str(e))
        try:
            p.model_request(0, "w", np.empty(99999, np.float32))
            failures.append("a size mismatch did not raise")
        except taiji.Mismatch as e:
            if "is 400000 bytes; the request's buffer is 399996 bytes" not in str(e):
                failures.append("Mismatch text: " + str(e))
        try:
            p.model_request(SIZE, "w", bytearray(4))
            failures.append("a rank out of range did not raise")
        except taiji.InvalidArgument:
            pass
        try:
            p.model_request(0, "w", b"read-only")
            failures.append("a read-only output did not raise")
        except ValueError:
            pass
        done = []
        r = p.model_request_async(0, "w", np.empty(100000, np.float32), version=2,
                                  callback=lambda req: done.append(req.status))
        r.wait(20)
        end = time.monotonic() + 5
        while not done and time.monotonic() < end:
            time.sleep(0.001)
        if done != [0]:
            failures.append(f"callback saw {done}")
    mine = np.empty(100000, np.float32)
    p.model_request(RANK, "w", mine, version=1)
    if not np.array_equal(mine, w):
        failures.append("own store differs")
    p.barrier("end")
    p.close()
    emit(failures)


def test_fetch_while_the_owner_is_busy(run_peers):
    for r in run_peers(fetch_while_busy, 3, timeout=120):
        assert r.results == [[]], (r.rank, r.results, r.stderr[-2000:])


def fetch_from_killed():
    import signal
    import time
    failures = []
    p = peer()
    mark = ARGS + "/posted"
    if RANK == 1:
        p.model_save("big", np.ones(16 << 20, np.float32))  # 64 MiB
    p.barrier("saved")
    if RANK == 1:
        end = time.monotonic() + 30
        while not os.path.exists(mark) and time.monotonic() < end:
            time.sleep(0.0005)
        with open(ARGS + "/killed", "w") as f:
            f.write(repr(time.monotonic()))
        os.kill(os.getpid(), signal.SIGKILL)
    outs = [np.empty(16 << 20, np.float32) for _ in range(4)]
    reqs = [p.model_request_async(1, "big", o, timeout_ms=60000) for o in outs]
    open(mark, "w").close()
    statuses = []
    for r in reqs:
        try:
            r.wait(10)
            statuses.append(("ok", time.monotonic()))
        except taiji.PeerLost as e:
            statuses.append(("lost", time.monotonic(), str(e)))
    end = time.monotonic() + 10
    while not os.path.exists(ARGS + "/killed") and time.monotonic() < end:
        time.sleep(0.01)
    killed = float(open(ARGS + "/killed").read())
    lost = [s for s in statuses if s[0] == "lost"]
    if not lost:
        failures.append("no request was in flight at the kill: " + repr(statuses))
    for s in lost:
        if s[1] - killed > 2.0:
            failures.append(f"PeerLost {s[1] - killed:.3f} s after the kill")
        if "rank 1" not in s[2]:
            failures.append("PeerLost text: " + s[2])
    posted = time.monotonic()
    try:
        p.model_request(1, "big", outs[0], timeout_ms=60000)
        failures.append("a request after the kill did not raise")
    except taiji.PeerLost:
        if time.monotonic() - posted > 2.0:
            failures.append("a request after the kill took over 2 s to fail")
    p.abort()
    emit(failures)


def test_request_to_a_killed_rank_fails_with_peer_lost(run_peers, tmp_path):
    results = run_peers(fetch_from_killed, 2, timeout=120, check=False, args=str(tmp_path))
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    assert results[0].results == [[]], results[0].stderr[-2000:]
    assert results[1].returncode == -9
