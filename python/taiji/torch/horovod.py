"""Horovod-compatible names over taiji: port a Horovod script by changing its import.

    import taiji.torch as hvd          # was: import horovod.torch as hvd
    hvd.init()
    ...

Every function takes Horovod's arguments and defaults. Where taiji behaves differently,
the docstring says how; docs/python-horovod.md lists the differences in one place.

Names. As in Horovod, an op is matched across ranks by its name; taiji prefixes it with
the op's kind (``allreduce.<name>``, ``broadcast.<name>``, ...), as Horovod does, so one
name may serve an allreduce and a broadcast. taiji versions every name automatically (the
n-th call with a name is version n on every rank), so the same name can be reused every
step and even be in flight twice. Ops without a name share one name per kind
(``allreduce.noname``) and are matched by call order: every rank must then post its
unnamed ops of a kind in the same order, as Horovod requires.

Handles. The ``*_async`` functions return an int handle, as Horovod's do, for ``poll`` and
``synchronize``; ``synchronize`` returns the output and forgets the handle.
"""

from __future__ import annotations

import itertools
import operator
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

import taiji

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "peer",
    "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "Compression", "HorovodInternalError",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "allgather", "reduce_scatter", "reducescatter", "barrier", "poll", "synchronize",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object", "set_topology", "DistributedOptimizer",
]

from .horovod_ops import (  # noqa: E402,F401  (Horovod's names live here too)
    Adasum, Average, BF16Compressor, Compression, Compressor, FP16Compressor,
    HorovodInternalError, Max, Min, NoneCompressor, Product, Sum, _ReduceOp, _taiji_op)

# ---- the process-wide peer ----------------------------------------------------------

_state_lock = threading.Lock()
_peer: Optional[taiji.Peer] = None
_owns_peer = False
_local: Tuple[int, int] = (0, 1)


def _env_int(*names: str) -> Optional[int]:
    for name in names:
        text = os.environ.get(name)
        if text:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not an integer") from None
    return None


def _host_key() -> bytes:
    # TAIJI_HOST is what taiji's host-aware topologies group by; fall back to the hostname.
    host = os.environ.get("TAIJI_HOST") or socket.gethostname()
    return host.encode()[:255].ljust(256, b"\0")


def _joined_late(p: taiji.Peer) -> bool:
    """Whether a resize started this process (a library without elastic membership: no)."""
    try:
        return p.joined_version > 1
    except taiji.Unsupported:
        return False


def _local_rank_and_size(p: taiji.Peer) -> Tuple[int, int]:
    lr = _env_int("TAIJI_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "SLURM_LOCALID")
    ls = _env_int("TAIJI_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if lr is not None and ls is not None:
        return lr, ls
    if _joined_late(p):
        # The members it joins post nothing but the state broadcasts after a resize; the
        # elastic helper counts again on every member (_count_local).
        return p.rank, p.size
    return _count_local(p)


def _count_local(p: taiji.Peer) -> Tuple[int, int]:
    """Counts the ranks that share this host (one small allgather: a collective)."""
    hosts = p.allgather(np.frombuffer(_host_key(), dtype=np.uint8).copy(),
                        "hvd.init.hosts").reshape(p.size, -1)
    mine = hosts[p.rank]
    same = [r for r in range(p.size) if np.array_equal(hosts[r], mine)]
    return same.index(p.rank), len(same)


def init(comm: Any = None, process_sets: Any = None, peer: Optional[taiji.Peer] = None,
         **peer_args: Any) -> None:
    """Joins the job: creates the process-wide peer from the environment.

    ``taiji-run`` sets TAIJI_*; under ``torchrun``, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
    are read (the rendezvous then listens on MASTER_PORT + 1). ``peer_args`` go to
    ``taiji.Peer`` (``timeout_ms=...``, ``settings={...}``); ``peer`` adopts a peer the
    caller made (shutdown then leaves it open). Calling init again does nothing, as in
    Horovod. Differences: ``comm`` (an MPI communicator) and ``process_sets`` are not
    supported; a non-None value raises NotImplementedError (use ``taiji.Peer.split``).
    """
    global _peer, _owns_peer, _local
    if comm is not None:
        raise NotImplementedError("taiji does not use MPI: init(comm=...) is not supported")
    if process_sets is not None:
        raise NotImplementedError("process sets are not supported; use taiji.Peer.split")
    with _state_lock:
        if _peer is not None:
            return
        p = peer if peer is not None else taiji.Peer(**peer_args)
        try:
            local = _local_rank_and_size(p)
        except BaseException:
            if peer is None:
                p.close()
            raise
        _peer, _owns_peer, _local = p, peer is None, local


def _membership_changed() -> None:
    """After a resize or shrink (taiji.torch.elastic calls it on every member, joiners
    included, at the same point): handles of the old membership are dropped, and
    local_rank()/local_size() are counted again from host names, since the launcher's
    variables describe the job as it started. A collective."""
    global _local
    p = peer()
    _handles.clear()
    _local = _count_local(p)


def shutdown() -> None:
    """Leaves the job: waits for ops in flight (bounded by their deadlines), then closes the
    peer. Handles not yet synchronized are forgotten. Safe to call twice or before init."""
    global _peer, _owns_peer
    with _state_lock:
        p, owned = _peer, _owns_peer
        _peer, _owns_peer = None, False
        _handles.clear()
    if p is not None and owned:
        p.close()


def is_initialized() -> bool:
    """Whether init() has run (and shutdown() has not)."""
    return _peer is not None


def peer() -> taiji.Peer:
    """The process-wide ``taiji.Peer`` (taiji only): for metrics, topologies, grad stats."""
    p = _peer
    if p is None:
        raise ValueError("taiji.torch has not been initialized; call hvd.init() first")
    return p


def rank() -> int:
    """This process's rank, 0..size()-1."""
    return peer().rank


def size() -> int:
    """The number of processes in the job."""
    return peer().size


def local_rank() -> int:
    """Rank among the processes on this host: TAIJI_LOCAL_RANK (taiji-run), LOCAL_RANK
    (torchrun), Open MPI's or Slurm's variable; without one, counted at init from the
    hosts' names (TAIJI_HOST, else the hostname)."""
    peer()
    return _local[0]


def local_size() -> int:
    """Processes on this host: TAIJI_LOCAL_SIZE, LOCAL_WORLD_SIZE, ... (as local_rank)."""
    peer()
    return _local[1]


def cross_rank() -> int:
    """The host's index, assuming every host runs local_size() ranks numbered host by host."""
    return rank() // local_size()


def cross_size() -> int:
    """The number of hosts, under the same assumption as cross_rank()."""
    return size() // local_size()


# ---- handles ------------------------------------------------------------------------

class _Pending:
    """What one Horovod handle stands for: taiji requests and how to make the output."""

    __slots__ = ("requests", "finish")

    def __init__(self, requests: List[taiji.Request], finish: Callable[[], Any]):
        self.requests = requests
        self.finish = finish


_handles: Dict[int, _Pending] = {}
_handle_ids = itertools.count(1)


def _register(requests: List[taiji.Request], finish: Callable[[], Any]) -> int:
    handle = next(_handle_ids)
    _handles[handle] = _Pending(requests, finish)
    return handle


def _pending(handle: int) -> _Pending:
    try:
        return _handles[handle]
    except KeyError:
        raise ValueError(f"unknown or already synchronized handle {handle!r}") from None


def poll(handle: int) -> bool:
    """True once the op behind ``handle`` has completed: ``synchronize`` will not block."""
    return all(r.test() for r in _pending(handle).requests)


def synchronize(handle: int) -> Any:
    """Waits for the op behind ``handle`` and returns its output (a tensor, or a list for
    the grouped ops, None for a barrier). Raises the op's ``taiji.TaijiError`` subclass
    (``HorovodInternalError``) on failure; either way the handle is forgotten."""
    pending = _pending(handle)
    try:
        for r in pending.requests:
            r.wait()
        return pending.finish()
    finally:
        _handles.pop(handle, None)


def _op_name(kind: str, name: Optional[str]) -> str:
    return f"{kind}.{name}" if name else f"{kind}.noname"


def _check_tensor(tensor: Any, what: str = "tensor") -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{what} is on {tensor.device}; taiji.torch takes CPU and CUDA tensors")
    return tensor


def _in_place_buffer(tensor: torch.Tensor) -> Tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    """A contiguous buffer standing for ``tensor`` and what copies it back afterwards."""
    if tensor.is_contiguous():
        return tensor.data, lambda: tensor
    buf = tensor.detach().contiguous()

    def copy_back():
        with torch.no_grad():
            tensor.copy_(buf)
        return tensor
    return buf, copy_back


# ---- allreduce ----------------------------------------------------------------------

def _allreduce_async(tensor: torch.Tensor, output: Optional[torch.Tensor], name, op, average,
                     prescale_factor: float, postscale_factor: float, **opts) -> int:
    tensor = _check_tensor(tensor)
    top = _taiji_op(op, average)
    p = peer()
    if output is None:  # in place
        buf, done = _in_place_buffer(tensor)
        if prescale_factor != 1.0:
            buf.mul_(prescale_factor)
        send = buf
    else:
        buf, done = output, (lambda: output)
        send = tensor.detach().contiguous()
        if prescale_factor != 1.0:
            send = send * prescale_factor
    request = p.allreduce_async(send, _op_name("allreduce", name), op=top, out=buf, **opts)

    def finish():
        if postscale_factor != 1.0:
            buf.mul_(postscale_factor)
        return done()
    return _register([request], finish)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[_ReduceOp] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = None) -> int:
    """Starts reducing ``tensor`` over all ranks into a new tensor; returns a handle.

    ``op``: Average (default), Sum, Min, Max, Product. Average is taiji's AVG: the sum
    divided by size(); on integer tensors it truncates toward zero (Horovod rejects or
    floors them). The input must not be written until the handle is synchronized."""
    _no_process_set(process_set)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_async(tensor, output, name, op, average, prescale_factor,
                            postscale_factor)


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[_ReduceOp] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = None) -> int:
    """Starts reducing ``tensor`` in place; returns a handle (see allreduce_async)."""
    _no_process_set(process_set)
    return _allreduce_async(tensor, None, name, op, average, prescale_factor,
                            postscale_factor)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[_ReduceOp] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """Reduces ``tensor`` in place over all ranks and returns it (see allreduce_async)."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _AllreduceFunction(torch.autograd.Function):
    """allreduce as an autograd function: its gradient is the same allreduce of the
    incoming gradient, as in Horovod."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor):
        ctx.args = (average, op, prescale_factor, postscale_factor)
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        average, op, pre, post = ctx.args
        grad = synchronize(allreduce_async(grad_output, average, None, op, pre, post))
        return grad, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: type = NoneCompressor, op: Optional[_ReduceOp] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """Returns ``tensor`` reduced over all ranks (Average by default); the input is not
    modified. Differentiable, as in Horovod. ``compression`` casts it for the wire."""
    _no_process_set(process_set)
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(compressed, average, name, op, prescale_factor,
                                       postscale_factor)
    return compression.decompress(reduced, ctx)


def _grouped_async(tensors: Sequence[torch.Tensor], in_place: bool, name, op, average,
                   prescale_factor, postscale_factor) -> int:
    tensors = [_check_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    base = name or "grouped"
    # One flat buffer per dtype, reduced by one allreduce: measured several times faster
    # than one op per tensor for tens of small tensors (docs/python-horovod.md).
    by_dtype: Dict[torch.dtype, List[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    flats, inner = [], []
    with peer().group():
        for dtype, indices in by_dtype.items():
            flat = torch.cat([tensors[i].detach().reshape(-1) for i in indices])
            flats.append((flat, indices))
            inner.append(_allreduce_async(flat, None, f"{base}.{str(dtype)[6:]}", op, average,
                                          prescale_factor, postscale_factor))
    pendings = [_handles.pop(h) for h in inner]

    def finish():
        outputs: List[Optional[torch.Tensor]] = [None] * len(tensors)
        for pending, (flat, indices) in zip(pendings, flats):
            pending.finish()
            start = 0
            for i in indices:
                t = tensors[i]
                part = flat[start:start + t.numel()].view(t.shape)
                start += t.numel()
                if in_place:
                    with torch.no_grad():
                        t.copy_(part)
                    outputs[i] = t
                else:
                    outputs[i] = part
        return outputs
    return _register([r for p in pendings for r in p.requests], finish)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[_ReduceOp] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None) -> int:
    """Starts reducing a list of tensors together; synchronize returns the list. The
    tensors of each dtype are packed into one flat buffer reduced by one allreduce named
    ``<name>.<dtype>`` (ranks must pass the same list)."""
    _no_process_set(process_set)
    return _grouped_async(tensors, False, name, op, average, prescale_factor, postscale_factor)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[_ReduceOp] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> int:
    """In-place grouped_allreduce_async."""
    _no_process_set(process_set)
    return _grouped_async(tensors, True, name, op, average, prescale_factor, postscale_factor)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: type = NoneCompressor,
                      op: Optional[_ReduceOp] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None
                      ) -> List[torch.Tensor]:
    """Returns each tensor reduced over all ranks, posted as one group. Unlike
    allreduce, not differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    out = synchronize(grouped_allreduce_async([c for c, _ in pairs], average, name, op,
                                              prescale_factor, postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, pairs)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[_ReduceOp] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> List[torch.Tensor]:
    """Reduces each tensor in place, posted as one group; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def _no_process_set(process_set: Any) -> None:
    if process_set is not None:
        raise NotImplementedError("process sets are not supported; use taiji.Peer.split")


# ---- broadcast ----------------------------------------------------------------------

def _check_root(root_rank: int) -> int:
    try:
        root = operator.index(root_rank)
    except TypeError:
        raise TypeError(f"root_rank must be an int, not {type(root_rank).__name__}") from None
    if not 0 <= root < size():
        raise ValueError(f"root_rank must be a rank in 0..{size() - 1}, not {root}")
    return root


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = None) -> int:
    """Starts copying root_rank's ``tensor`` into every rank's ``tensor``; returns a handle."""
    _no_process_set(process_set)
    tensor = _check_tensor(tensor)
    buf, done = _in_place_buffer(tensor)
    root = _check_root(root_rank)
    request = peer().broadcast_async(buf, _op_name("broadcast", name), root)
    return _register([request], done)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = None) -> int:
    """Starts a broadcast into a new tensor (the input is not modified); returns a handle."""
    _no_process_set(process_set)
    out = _check_tensor(tensor).detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> torch.Tensor:
    """Copies root_rank's ``tensor`` into every rank's, in place, and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Returns root_rank's ``tensor`` on every rank; the input is not modified. Unlike
    Horovod's, not differentiable."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


# ---- allgather and reduce-scatter ---------------------------------------------------

def _allgather_padded(t: torch.Tensor, base: str) -> Tuple[torch.Tensor, List[int]]:
    """Every rank's ``t`` (first dimensions may differ) as (size, most, ...) blocks padded
    to the largest, and each rank's first dimension."""
    p = peer()
    rows = p.allgather(torch.tensor([t.shape[0]], dtype=torch.int64), base + ".rows")
    rows = [int(r) for r in rows.reshape(-1)]
    most = max(rows)
    block = t
    if t.shape[0] != most:
        block = torch.zeros((most,) + tuple(t.shape[1:]), dtype=t.dtype)
        block[: t.shape[0]] = t
    gathered = p.allgather(block, base).reshape((p.size, most) + tuple(t.shape[1:]))
    return gathered, rows


def allgather(tensor: torch.Tensor, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along dimension 0, in rank order.

    As in Horovod the first dimension may differ between ranks (the other dimensions must
    agree). taiji's allgather takes equal blocks, so this is two ops: an allgather of the
    first dimensions, then one of the blocks padded to the largest. Blocking."""
    _no_process_set(process_set)
    t = _check_tensor(tensor).detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    gathered, rows = _allgather_padded(t, _op_name("allgather", name))
    return torch.cat([gathered[r, : rows[r]] for r in range(len(rows))])


def reduce_scatter(tensor: torch.Tensor, name: Optional[str] = None,
                   compression: type = NoneCompressor, op: Optional[_ReduceOp] = Average,
                   process_set: Any = None, prescale_factor: float = 1.0,
                   postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces ``tensor`` over all ranks (Average by default) and returns this rank's slice
    of dimension 0. As in Horovod, with d rows the first d % size() ranks get one row more.
    Blocking; every rank must pass the same shape."""
    _no_process_set(process_set)
    tensor = _check_tensor(tensor)
    top = _taiji_op(op)
    p = peer()
    t, ctx = compression.compress(tensor.detach().contiguous())
    if t.dim() == 0:
        raise ValueError("reduce_scatter needs a tensor with at least one dimension")
    if prescale_factor != 1.0:
        t = t * prescale_factor
    n, rest = p.size, tuple(t.shape[1:])
    counts = [t.shape[0] // n + (1 if r < t.shape[0] % n else 0) for r in range(n)]
    most = max(counts)
    blocks = t
    if any(c != most for c in counts):
        # Pad each rank's block to equal size: the padding reduces only with padding.
        blocks = torch.zeros((n, most) + rest, dtype=t.dtype)
        start = 0
        for r, c in enumerate(counts):
            blocks[r, :c] = t[start:start + c]
            start += c
    out = p.reduce_scatter(blocks.contiguous(), _op_name("reducescatter", name), op=top)
    out = out.reshape((most,) + rest)[: counts[p.rank]].clone()
    if postscale_factor != 1.0:
        out.mul_(postscale_factor)
    return compression.decompress(out, ctx)


# Horovod's spelling.
reducescatter = reduce_scatter


def barrier(process_set: Any = None) -> None:
    """Returns once every rank has called barrier()."""
    _no_process_set(process_set)
    peer().barrier("barrier")


def set_topology(topology: Any) -> None:
    """Switches the topology that later ops run on (taiji only; a collective: every rank
    calls it at the same point). ``topology``: a ``taiji.Topology``, a built-in name
    ("ring", "tree", "star", ...), or None for the automatic choice by size."""
    peer().set_topology(topology)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression: type = NoneCompressor, backward_passes_per_step: int = 1,
                         op: _ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups=None, sparse_as_dense: bool = False,
                         process_set: Any = None, grad_stats: Any = None,
                         bucket_bytes: Optional[int] = None):
    """Wraps ``optimizer`` so that gradients are allreduced as backward produces them;
    see ``taiji.torch.optimizer.DistributedOptimizer``."""
    from . import optimizer as impl
    return impl.DistributedOptimizer(
        optimizer, named_parameters=named_parameters, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set,
        grad_stats=grad_stats,
        bucket_bytes=impl.DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes)


# After everything they use is defined: they call back into this module.
from .horovod_state import (  # noqa: E402,F401
    ParamsLike, allgather_object, broadcast_object, broadcast_optimizer_state,
    broadcast_parameters)
