"""ProcessGroupTaiji: a torch.distributed process group over taiji.

Importing :mod:`taiji.torch` registers it as backend ``"taiji"``, so
``torch.distributed.init_process_group("taiji")``, ``new_group(..., backend="taiji")``,
DistributedDataParallel, its comm hooks, PostLocalSGD and PeriodicModelAverager run on
taiji unchanged.

Bootstrap. Each group is its own taiji job, met through the store torch hands the
creator: rank 0 starts a :class:`taiji.RendezvousServer` on a port the system chooses (at
TAIJI_LISTEN_HOST, else MASTER_ADDR, else 127.0.0.1) and publishes its address and a
fresh job id in the group's store; the other ranks read them. So every ``new_group`` gets
its own rendezvous, and no port is guessed.

Matching. Each kind of op has one name per group (``allreduce``, ``broadcast``, ...) and
taiji's automatic versions count its calls, so the n-th allreduce of a group meets the
n-th allreduce of every rank, as torch requires; a rank that posts it with another count
or op gets :class:`taiji.Mismatch` instead of wrong data.

Completion. A :class:`WorkTaiji`'s future completes on the package's callback thread,
never on taiji's I/O thread (whose callbacks must not block), or on the thread that calls
``wait``, whichever comes first. Works stay referenced until they completed (and a while
after), because C++ waiting on a Work whose Python object was collected waits forever.
"""
from __future__ import annotations

import atexit
import collections
import datetime
import inspect
import os
import threading
import uuid
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

import taiji

__all__ = ["ProcessGroupTaiji", "WorkTaiji", "BACKEND_NAME", "create_process_group",
           "peer_of"]

BACKEND_NAME = "taiji"

_RENDEZVOUS_KEY = "taiji/rendezvous"

# torch's reduce operators that taiji computes itself; BAND, BOR, BXOR and PREMUL_SUM have
# no taiji counterpart and are refused.
_REDUCE_OPS = {
    c10d.ReduceOp.RedOpType.SUM: taiji.SUM,
    c10d.ReduceOp.RedOpType.PRODUCT: taiji.PROD,
    c10d.ReduceOp.RedOpType.MIN: taiji.MIN,
    c10d.ReduceOp.RedOpType.MAX: taiji.MAX,
    c10d.ReduceOp.RedOpType.AVG: taiji.AVG,
}

# Completed works kept referenced, per group: C++ (broadcast_coalesced, DDP) may wait on a
# Work after it completed, and must still find its Python half. Each keeps its outputs
# alive through its future, so the window is bounded: a few hundred ops is far more than
# C++ keeps between a post and its wait.
_RECENT_WORKS = 256


def _taiji_op(op: Any) -> int:
    kind = getattr(op, "op", op)
    try:
        return _REDUCE_OPS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"taiji backend: reduce op {op} is not supported "
                         "(SUM, PRODUCT, MIN, MAX and AVG are)") from None


def _timeout_ms(timeout: Optional[datetime.timedelta]) -> int:
    if timeout is None or timeout.total_seconds() <= 0:
        return 0
    return max(1, int(timeout.total_seconds() * 1000))


# The devices the backend serves: CPU tensors over taiji's host path, CUDA tensors over
# NCCL (taiji's device backend, docs/gpu.md).
DEVICES = ("cpu", "cuda")


def _check_cpu(tensors: Sequence[torch.Tensor], what: str, devices: Sequence[str] = DEVICES) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"taiji backend: {what} must be tensors, got {type(t).__name__}")
        if t.device.type not in devices:
            raise ValueError(f"taiji backend: {what} must be {' or '.join(d.upper() for d in devices)} "
                             f"tensors, got {t.device}")


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


class WorkTaiji(c10d.Work):
    """The Work of one c10d call: one or more taiji requests, then an optional finishing
    step (copying a staging buffer back) before the future gets ``result``."""

    def __init__(self, group: "ProcessGroupTaiji", requests: List[taiji.Request],
                 result: Any, finish: Optional[Callable[[], None]] = None) -> None:
        super().__init__()
        self._group = group
        self._requests = requests
        self._result = result
        self._finish = finish
        self._future: torch.futures.Future = torch.futures.Future()
        self._lock = threading.Lock()
        self._remaining = len(requests)
        self._completed = False
        self._finished = threading.Event()  # set once outputs are final
        self._exception: Optional[BaseException] = None
        group._keep(self)
        if not requests:
            self._complete(None)
        for request in requests:
            request.add_done_callback(self._one_done)

    def _one_done(self, request: taiji.Request) -> None:
        # On the package's callback thread.
        error = None
        try:
            request.wait(0)
        except BaseException as exc:  # the op's TaijiError, kept for wait() and the future
            error = exc
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if error is not None or last:
            self._complete(error)

    def _complete(self, error: Optional[BaseException]) -> None:
        with self._lock:
            first = not self._completed
            self._completed = True
        if not first:
            # The other thread may still be copying outputs: they are final only then.
            self._finished.wait()
            return
        if error is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as exc:
                error = exc
        self._exception = error
        self._requests = []
        self._finish = None
        # Before the future: its callbacks run inline and may wait on this Work.
        self._finished.set()
        if error is not None:
            self._future.set_exception(error)
        else:
            self._future.set_result(self._result)
        self._group._release(self)

    # --- c10d::Work -------------------------------------------------------------------
    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Waits for the op (``timeout`` 0: as long as the op's own deadline allows) and
        raises its error. A finite timeout that passes first raises RuntimeError."""
        seconds = timeout.total_seconds() if timeout else 0.0
        requests = list(self._requests)
        try:
            for request in requests:
                request.wait(None if seconds <= 0 else seconds)
        except taiji.TaijiError as exc:  # first: taiji.Timeout is also a TimeoutError
            self._complete(exc)
        except TimeoutError as exc:  # the caller's timeout passed; the op goes on
            raise RuntimeError(f"taiji backend: {exc}") from None
        # Completing here, not only on the callback thread, lets a wait made from a chain
        # that runs on that thread finish instead of waiting for itself.
        self._complete(None)
        if self._exception is not None:
            raise self._exception
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._finished.is_set()

    def is_success(self) -> bool:
        return self._finished.is_set() and self._exception is None

    def exception(self) -> Optional[BaseException]:
        return self._exception

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._result if isinstance(self._result, list) else []

    def synchronize(self) -> None:
        pass


class ProcessGroupTaiji(c10d.ProcessGroup):
    """A c10d process group over one taiji peer (one taiji job per group)."""

    def __init__(self, store: Any, rank: int, size: int,
                 timeout: datetime.timedelta = datetime.timedelta(minutes=30),
                 peer: Optional[taiji.Peer] = None) -> None:
        super().__init__(rank, size)
        self._timeout_ms = _timeout_ms(timeout)
        self._server: Optional[taiji.RendezvousServer] = None
        self._works: set = set()
        self._recent: collections.deque = collections.deque(maxlen=_RECENT_WORKS)
        self._works_lock = threading.Lock()
        self.peer = peer if peer is not None else self._bootstrap(store, rank, size)
        _live_groups.add(self)

    def _bootstrap(self, store: Any, rank: int, size: int) -> taiji.Peer:
        if rank == 0:
            host = (os.environ.get("TAIJI_LISTEN_HOST") or os.environ.get("MASTER_ADDR")
                    or "127.0.0.1")
            self._server = taiji.RendezvousServer(f"{host}:0")
            address, job_id = self._server.address, f"torch-{uuid.uuid4().hex}"
            store.set(_RENDEZVOUS_KEY, f"{address} {job_id}")
        else:
            address, job_id = store.get(_RENDEZVOUS_KEY).decode("utf-8").split(" ")
        return taiji.Peer(rank=rank, size=size, rendezvous=address, host_rendezvous=False,
                          job_id=job_id, timeout_ms=self._timeout_ms or None,
                          init_timeout_ms=self._timeout_ms or None)

    # --- bookkeeping --------------------------------------------------------------------
    def _keep(self, work: WorkTaiji) -> None:
        with self._works_lock:
            self._works.add(work)

    def _release(self, work: WorkTaiji) -> None:
        with self._works_lock:
            self._works.discard(work)
            self._recent.append(work)

    def _opts(self, timeout: Optional[datetime.timedelta] = None) -> dict:
        ms = _timeout_ms(timeout) if timeout is not None else 0
        # torch's default option timeout (-1 ms) means "the group's".
        return {"timeout_ms": ms or self._timeout_ms}

    def close(self) -> None:
        """Finalizes and frees the peer, then stops the rendezvous this rank served.
        Idempotent; called by ``destroy_process_group`` and at exit."""
        peer, self.peer = getattr(self, "peer", None), None
        if peer is not None:
            peer.close()
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        _live_groups.discard(self)

    def _require_peer(self) -> taiji.Peer:
        if self.peer is None:
            raise RuntimeError("taiji backend: the process group was destroyed")
        return self.peer

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    # --- collectives ------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_cpu(tensors, "allreduce tensors")
        op = _taiji_op(opts.reduceOp)
        peer = self._require_peer()
        kw = self._opts(opts.timeout)
        requests, copies = [], []
        for t in tensors:
            buf = _contiguous(t)
            requests.append(peer.allreduce_async(buf, "allreduce", op=op, out=buf, **kw))
            if buf is not t:
                copies.append((t, buf))
        return WorkTaiji(self, requests, list(tensors), _copier(copies))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> WorkTaiji:
        ar = c10d.AllreduceOptions()
        if opts is not None:
            ar.reduceOp = opts.reduceOp
            ar.timeout = opts.timeout
        return self.allreduce(tensors, ar)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.BroadcastOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_cpu(tensors, "broadcast tensors")
        root = int(opts.rootRank)
        peer = self._require_peer()
        kw = self._opts(opts.timeout)
        requests, copies = [], []
        for t in tensors:
            buf = _contiguous(t)
            requests.append(peer.broadcast_async(buf, "broadcast", root, **kw))
            if buf is not t:
                copies.append((t, buf))
        return WorkTaiji(self, requests, list(tensors), _copier(copies))

    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor], opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.AllgatherOptions()
        if isinstance(input_tensors, torch.Tensor):  # the (outputs, input) overload
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        if len(output_tensors) != len(input_tensors):
            raise ValueError("taiji backend: allgather needs one output list per input")
        peer = self._require_peer()
        kw = self._opts(opts.timeout)
        requests, finishes = [], []
        for outs, t in zip(output_tensors, input_tensors):
            _check_cpu([t], "allgather inputs")
            _check_cpu(outs, "allgather outputs")
            if len(outs) != self.size():
                raise ValueError(f"taiji backend: allgather needs {self.size()} outputs "
                                 f"per input, got {len(outs)}")
            for o in outs:
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError("taiji backend: allgather outputs must match the "
                                     "input's size and dtype")
            src = _contiguous(t)
            flat = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype, device=t.device)
            requests.append(peer.allgather_async(src, "allgather", out=flat, **kw))
            finishes.append((outs, flat))

        def finish() -> None:
            for outs, flat in finishes:
                for i, o in enumerate(outs):
                    o.copy_(flat[i].view_as(o))
        return WorkTaiji(self, requests, [o for outs in output_tensors for o in outs], finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.AllgatherOptions()
        _check_cpu([output, input], "allgather tensors")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError("taiji backend: the output must hold size * input elements "
                             "of the input's dtype")
        out = _contiguous(output)
        req = self._require_peer().allgather_async(_contiguous(input), "allgather",
                                                   out=out.view(-1), **self._opts(opts.timeout))
        return WorkTaiji(self, [req], [output], _copier([(output, out)] if out is not output
                                                           else []))

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.ReduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_cpu(tensors, "reduce tensors")
        op = _taiji_op(opts.reduceOp)
        root = int(opts.rootRank)
        peer = self._require_peer()
        kw = self._opts(opts.timeout)
        requests, copies = [], []
        for t in tensors:
            buf = _contiguous(t)
            requests.append(peer.reduce_async(buf, "reduce", root, op=op, out=buf, **kw))
            if buf is not t and self.rank() == root:
                copies.append((t, buf))
        return WorkTaiji(self, requests, list(tensors), _copier(copies))

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        op = _taiji_op(opts.reduceOp)
        peer = self._require_peer()
        kw = self._opts(opts.timeout)
        requests, copies = [], []
        for out, ins in zip(output_tensors, input_tensors):
            _check_cpu([out], "reduce_scatter outputs")
            _check_cpu(ins, "reduce_scatter inputs")
            if len(ins) != self.size() or any(i.numel() != out.numel() for i in ins):
                raise ValueError(f"taiji backend: reduce_scatter needs {self.size()} inputs "
                                 "the size of the output")
            flat = torch.cat([i.reshape(-1) for i in ins])
            buf = _contiguous(out)
            requests.append(peer.reduce_scatter_async(flat, "reduce_scatter", op=op,
                                                      out=buf.view(-1), **kw))
            if buf is not out:
                copies.append((out, buf))
        return WorkTaiji(self, requests, list(output_tensors), _copier(copies))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> WorkTaiji:
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        _check_cpu([output, input], "reduce_scatter tensors")
        if input.numel() != output.numel() * self.size():
            raise ValueError("taiji backend: the input must hold size * output elements")
        out = _contiguous(output)
        req = self._require_peer().reduce_scatter_async(
            _contiguous(input).view(-1), "reduce_scatter", op=_taiji_op(opts.reduceOp),
            out=out.view(-1), **self._opts(opts.timeout))
        return WorkTaiji(self, [req], [output], _copier([(output, out)] if out is not output
                                                           else []))

    def barrier(self, opts: Any = None) -> WorkTaiji:
        timeout = getattr(opts, "timeout", None) if opts is not None else None
        req = self._require_peer().barrier_async("barrier", **self._opts(timeout))
        return WorkTaiji(self, [req], [])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> WorkTaiji:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_cpu(tensors, "send tensors", ("cpu",))
        peer = self._require_peer()
        requests = [peer.send_async(_contiguous(t), f"p2p/{tag}", int(dst), **self._opts())
                    for t in tensors]
        return WorkTaiji(self, requests, list(tensors))

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> WorkTaiji:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_cpu(tensors, "recv tensors", ("cpu",))
        peer = self._require_peer()
        requests, copies = [], []
        for t in tensors:
            buf = _contiguous(t)
            requests.append(peer.recv_async(buf, f"p2p/{tag}", int(src), **self._opts()))
            if buf is not t:
                copies.append((t, buf))
        return WorkTaiji(self, requests, list(tensors), _copier(copies))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> WorkTaiji:
        raise RuntimeError("taiji backend: recv from any source is not supported "
                           "(taiji matches a recv by its sender)")


def peer_of(group: Optional[Any] = None) -> taiji.Peer:
    """The taiji peer of a "taiji" process group (None: the default group), to use the
    core or the Horovod-style API on the same ranks: ``hvd.init(peer=peer_of())``."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupTaiji) or pg.peer is None:
        raise RuntimeError("taiji backend: not a live 'taiji' process group")
    return pg.peer


def _copier(copies: List[Any]) -> Optional[Callable[[], None]]:
    if not copies:
        return None

    def finish() -> None:
        for dst, src in copies:
            dst.copy_(src.view_as(dst))
    return finish


# ---- creation, destruction, exit -------------------------------------------------------

_live_groups: "weakref.WeakSet[ProcessGroupTaiji]" = weakref.WeakSet()
_adoptable: List[taiji.Peer] = []  # the peer a taiji-run rendezvous made for the world group


def create_process_group(store: Any, rank: int, size: int,
                         timeout: datetime.timedelta) -> ProcessGroupTaiji:
    """The creator registered with ``torch.distributed.Backend.register_backend``."""
    peer = None
    if _adoptable and _adoptable[0].rank == rank and _adoptable[0].size == size:
        peer = _adoptable.pop()
    return ProcessGroupTaiji(store, rank, size, timeout, peer=peer)


def _close_all() -> None:
    """At exit: the groups never destroyed, subgroups before the world group."""
    import torch.distributed.distributed_c10d as c10d_py
    world = c10d_py.GroupMember.WORLD
    for group in sorted(list(_live_groups), key=lambda g: g is world):
        group.close()
    while _adoptable:
        _adoptable.pop().close()


def _wrap_destroy() -> None:
    import torch.distributed.distributed_c10d as c10d_py
    original = c10d_py.destroy_process_group
    if getattr(original, "_taiji_wrapped", False):
        return

    def destroy_process_group(group: Optional[Any] = None) -> None:
        world = c10d_py.GroupMember.WORLD
        if group is None or group is world:
            doomed = list(c10d_py._pg_map.keys())
        else:
            doomed = [group]
        original(group)
        # Subgroups first, the world group last.
        for pg in sorted(doomed, key=lambda g: g is world):
            if isinstance(pg, ProcessGroupTaiji):
                pg.close()
        if group is None or group is world:
            while _adoptable:
                _adoptable.pop().close()

    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group._taiji_wrapped = True  # type: ignore[attr-defined]
    c10d_py.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _register() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=list(DEVICES))
        else:  # torch before 2.1 has no per-device backends: the one backend takes both
            dist.Backend.register_backend(BACKEND_NAME, create_process_group)
    _wrap_destroy()
    atexit.register(_close_all)
