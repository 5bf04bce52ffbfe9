"""No hang at exit: processes that never close their peer, that exit with requests in
flight, that close from a callback, or drop the peer to the garbage collector. Each is run
repeatedly under a timeout: the finalize/GIL deadlock (about 1 run in 5 in the prototype)
must not come back."""
import pytest

REPEATS = 10

NEVER_CLOSED = """
p = peer()
p.allreduce(np.ones(1000, np.float32), "x")
emit("done")
"""

IN_FLIGHT = """
p = peer()
reqs = [p.allreduce_async(np.ones(1 << 16, np.float32), f"f{i}",
                          callback=lambda r: None) for i in range(8)]
emit("done")
"""

CLOSE_IN_CALLBACK = """
import threading
p = peer()
closed = threading.Event()
def close_it(request):
    p.close()
    closed.set()
p.allreduce_async(np.ones(100, np.float32), "c", callback=close_it)
closed.wait(30)
emit(p.closed)
"""

COLLECTED = """
import gc
p = peer()
r = p.allreduce_async(np.ones(100, np.float32), "g")
r.wait(30)
del p, r
gc.collect()
emit("done")
"""

TORCH_IN_FLIGHT = """
import torch
p = peer()
for i in range(4):
    p.allreduce_async(torch.ones(1 << 15), f"t{i}", callback=lambda r: None)
emit("done")
"""


@pytest.mark.parametrize("body,repeats", [
    (NEVER_CLOSED, REPEATS), (IN_FLIGHT, REPEATS), (CLOSE_IN_CALLBACK, REPEATS),
    (COLLECTED, REPEATS), (TORCH_IN_FLIGHT, 4)],
    ids=["never-closed", "in-flight", "close-in-callback", "collected", "torch-in-flight"])
def test_exit_does_not_hang(run_peers, body, repeats):
    for attempt in range(repeats):
        for r in run_peers(body, 2, timeout=30):
            assert r.results in (["done"], [True]), (attempt, r.stdout, r.stderr)
            assert "Fatal" not in r.stderr and "Traceback" not in r.stderr, r.stderr
