"""Every collective x every dtype x every op, on 1..4 processes, against NumPy.

Inputs are small integers, so every float result is exact whatever order the runtime
combines in (f16 and bf16 hold them exactly too); only AVG of floats divides, and is
compared within the dtype's rounding (docs/semantics.md). One run per world size checks
everything; each rank compares its own results and reports the failures.
"""
import pytest


def matrix():
    import numpy as np

    dtypes = ["float32", "float64", "float16", "int8", "uint8", "int32", "uint32",
              "int64", "uint64"]
    use_torch = ARGS["torch"]
    if use_torch:
        import torch
        dtypes.append("bfloat16")
    ops = [taiji.SUM, taiji.PROD, taiji.MIN, taiji.MAX, taiji.AVG]
    count = 13
    failures = []
    checked = 0

    def values(rank, op, dtype):
        i = np.arange(count)
        if op == taiji.PROD:
            v = (rank + i) % 2 + 1
        else:
            v = (rank * 7 + i * 3) % 5 + 1
        return v.astype(np.float64)

    def make(v, dtype):
        if dtype == "bfloat16":
            return torch.tensor(v, dtype=torch.float32).to(torch.bfloat16)
        return v.astype(dtype)

    def as_np(x):
        if dtype == "bfloat16":
            return x.to(torch.float64).numpy()
        return np.asarray(x, dtype=np.float64)

    def reference(op, dtype):
        stack = np.stack([values(r, op, dtype) for r in range(SIZE)])
        if op == taiji.SUM:
            return stack.sum(0)
        if op == taiji.PROD:
            return stack.prod(0)
        if op == taiji.MIN:
            return stack.min(0)
        if op == taiji.MAX:
            return stack.max(0)
        total = stack.sum(0)
        if dtype.startswith(("int", "uint")):
            return np.trunc(total / SIZE)
        return total / SIZE

    def expect(what, got, want, dtype, op=None):
        nonlocal checked
        checked += 1
        got = as_np(got)
        if op == taiji.AVG and not dtype.startswith(("int", "uint")):
            rtol = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-6}.get(dtype, 1e-12)
            ok = np.allclose(got, want, rtol=rtol, atol=0)
        else:
            ok = got.shape == np.shape(want) and np.array_equal(got, want)
        if not ok:
            failures.append(f"{what} {dtype}: got {got.tolist()} want {np.asarray(want).tolist()}")

    with peer() as p:
        for dtype in dtypes:
            for op in ops:
                tag = f"{dtype}.{int(op)}"
                mine = make(values(RANK, op, dtype), dtype)
                want = reference(op, dtype)
                expect(f"allreduce {op.name}", p.allreduce(mine, "ar." + tag, op=op), want,
                       dtype, op)
                inplace = make(values(RANK, op, dtype), dtype)
                res = p.allreduce(inplace, "ar.inplace." + tag, op=op, out=inplace)
                if res is not inplace:
                    failures.append("allreduce out=x does not return x")
                expect(f"allreduce in place {op.name}", inplace, want, dtype, op)
                out = make(np.zeros(count), dtype)
                p.allreduce(mine, "ar.out." + tag, op=op, out=out)
                expect(f"allreduce out= {op.name}", out, want, dtype, op)

                root = (SIZE - 1) if op % 2 else 0
                res = p.reduce(mine, "red." + tag, root, op=op)
                if RANK == root:
                    expect(f"reduce {op.name}", res, want, dtype, op)
                elif res is not None:
                    failures.append("reduce returned something off the root")

                blocks = make(np.concatenate([values(RANK + b, op, dtype)
                                              for b in range(SIZE)]), dtype)
                stack = np.stack([np.concatenate([values(r + b, op, dtype)
                                                  for b in range(SIZE)]) for r in range(SIZE)])
                block = stack[:, RANK * count:(RANK + 1) * count]
                want_rs = {taiji.SUM: block.sum(0), taiji.PROD: block.prod(0),
                           taiji.MIN: block.min(0), taiji.MAX: block.max(0)}.get(op)
                if want_rs is None:
                    want_rs = block.sum(0) / SIZE
                    if dtype.startswith(("int", "uint")):
                        want_rs = np.trunc(want_rs)
                expect(f"reduce_scatter {op.name}", p.reduce_scatter(blocks, "rs." + tag, op=op),
                       want_rs, dtype, op)

            mine = make(values(RANK, taiji.SUM, dtype), dtype)
            everyone = np.stack([values(r, taiji.SUM, dtype) for r in range(SIZE)])
            expect("allgather", p.allgather(mine, "ag." + dtype), everyone, dtype)
            got = p.gather(mine, "ga." + dtype, SIZE // 2)
            if RANK == SIZE // 2:
                expect("gather", got, everyone, dtype)
            b = make(values(RANK, taiji.SUM, dtype), dtype)
            if p.broadcast(b, "bc." + dtype, SIZE - 1) is not b:
                failures.append("broadcast does not return x")
            expect("broadcast", b, values(SIZE - 1, taiji.SUM, dtype), dtype)

        big = np.arange(300_000, dtype=np.float32) % 1000 + RANK
        want = (np.arange(300_000) % 1000) * SIZE + sum(range(SIZE))
        dtype = "float32"
        expect("allreduce 300k", p.allreduce(big, "big"), want, dtype)
        same = p.consensus(np.arange(8, dtype=np.int64), "agree")
        differ = p.consensus(np.arange(8, dtype=np.int64) + (RANK == SIZE - 1), "disagree")
        if not same or (differ if SIZE > 1 else not differ):
            failures.append(f"consensus: same={same} differ={differ}")
        p.barrier("end")
    emit({"failures": failures, "checked": checked})


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_collective_dtype_and_op(run_peers, size):
    torch_ok = size in (1, 3)  # bf16 through torch on an odd and the trivial size
    results = run_peers(matrix, size, timeout=120, args={"torch": torch_ok})
    for r in results:
        (report,) = r.results
        assert report["failures"] == [], f"rank {r.rank}: {report['failures'][:5]}"
        assert report["checked"] >= 9 * 5 * 4 + 9 * 2 + 1  # reduce and gather: roots only
