"""send/recv and split from Python, on real peers."""
import numpy as np

import taiji


def p2p():
    failures = []
    with peer() as p:
        right, left = (RANK + 1) % SIZE, (RANK - 1) % SIZE
        for dtype in ["float32", "float64", "float16", "int8", "uint8", "int32", "uint32",
                      "int64", "uint64"]:
            out = np.arange(7).astype(dtype) + RANK
            inbox = np.zeros(7, dtype)
            s = p.send_async(out, "ring." + dtype, right)
            got = p.recv(inbox, "ring." + dtype, left)
            s.wait(30)
            if got is not inbox or not np.array_equal(inbox, np.arange(7).astype(dtype) + left):
                failures.append(f"{dtype}: {inbox.tolist()}")
        try:
            if RANK == 0:
                p.send(np.zeros(3, np.float32), "mm", 1)
            elif RANK == 1:
                p.recv(np.zeros(4, np.float32), "mm", 0)
            else:
                raise taiji.Mismatch(-4, "not part of it")
            failures.append("send/recv count mismatch not raised")
        except taiji.Mismatch:
            pass
        try:
            p.send(np.zeros(1, np.float32), "self", RANK)
            failures.append("send to self not refused")
        except taiji.InvalidArgument:
            pass
        p.barrier("end")
    emit(failures)


def split():
    failures = []
    with peer() as p:
        color = RANK % 2 if RANK < 3 else -1
        child = p.split(color, key=-RANK)
        if color < 0:
            if child is not None:
                failures.append("negative color got a child")
        else:
            members = [r for r in range(min(SIZE, 3)) if r % 2 == color]
            order = sorted(members, key=lambda r: (-r, r))
            if child.size != len(members) or child.rank != order.index(RANK):
                failures.append(f"child rank {child.rank}/{child.size}")
            got = child.allreduce(np.array([RANK], np.int64), "sum")
            if got.tolist() != [sum(members)]:
                failures.append(f"child sum {got.tolist()}")
        # Closing the parent closes the child first.
    if child is not None and not child.closed:
        failures.append("child outlived its parent")
    emit(failures)


def test_send_recv_ring_every_dtype(run_peers):
    for r in run_peers(p2p, 3, timeout=90):
        assert r.results == [[]], (r.rank, r.results, r.stderr)


def test_split_by_color_and_key(run_peers):
    for r in run_peers(split, 4, timeout=90):
        assert r.results == [[]], (r.rank, r.results, r.stderr)

