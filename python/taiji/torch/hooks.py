"""DDP comm hooks over taiji, for ``DistributedDataParallel.register_comm_hook``.

    from taiji.torch import hooks
    ddp.register_comm_hook(None, hooks.allreduce_hook)            # averaged gradients
    state = hooks.GradStatsState(batch_size=32)
    ddp.register_comm_hook(state, hooks.grad_stats_hook)          # plus noise scale, SNR
    ...
    state.stats["noise_scale"], state.stats["snr"]

Both average the bucket through taiji directly (one AVG allreduce per bucket, named by
the bucket's index so every rank matches it), on the DDP group's taiji peer when DDP runs
over the "taiji" backend, else on ``state.peer`` (any :class:`taiji.Peer` of the same
ranks). ``grad_stats_hook`` attaches a :class:`taiji.GradStats` to each bucket's
allreduce, so the statistics ride in the same allreduce as the gradients; a step ends
once every bucket of the iteration has been reduced.
"""
import math
import threading
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

import taiji

from .process_group import peer_of as _peer_of

__all__ = ["allreduce_hook", "grad_stats_hook", "GradStatsState", "TaijiHookState"]


class TaijiHookState:
    """State of :func:`allreduce_hook`: which taiji peer to use. ``process_group`` None
    means DDP's default group; it must be a "taiji" group unless ``peer`` is given."""

    def __init__(self, process_group: Optional[Any] = None,
                 peer: Optional[taiji.Peer] = None) -> None:
        self.process_group = process_group
        self.peer = peer

    def taiji_peer(self) -> taiji.Peer:
        if self.peer is not None:
            return self.peer
        return _peer_of(self.process_group)


def _future_of(request: taiji.Request, value: torch.Tensor,
               then: Optional[Any] = None) -> "torch.futures.Future[torch.Tensor]":
    fut: torch.futures.Future = torch.futures.Future()

    def done(req: taiji.Request) -> None:  # on the package's callback thread
        try:
            req.wait(0)
            if then is not None:
                then()
        except BaseException as exc:
            fut.set_exception(exc)
            return
        fut.set_result(value)
    request.add_done_callback(done)
    return fut


def _bucket_name(kind: str, bucket: dist.GradBucket) -> str:
    return f"{kind}/bucket{bucket.index()}"


# DDP checks these annotations by identity: they must be dist.GradBucket and
# torch.futures.Future[torch.Tensor] themselves (hence no postponed annotations here).
def allreduce_hook(state: Optional[Any],
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients with one taiji AVG allreduce (the sum divided by
    the world size in the reduction, not by a separate pass as DDP's default does)."""
    peer = state.taiji_peer() if isinstance(state, TaijiHookState) else _peer_of(state)
    tensor = bucket.buffer()
    request = peer.allreduce_async(tensor, _bucket_name("ddp", bucket), op=taiji.AVG,
                                   out=tensor)
    return _future_of(request, tensor)


class GradStatsState(TaijiHookState):
    """State of :func:`grad_stats_hook`. ``batch_size``: samples per rank per step.
    After each step ``stats`` holds the latest estimates (a dict: ``noise_scale``,
    ``snr``, ``g2``, ``trace_sigma``, ``state``, ``steps``, ...; see
    :meth:`taiji.GradStats.read`). A step ends when every bucket of the iteration has
    been reduced: the hook counts the buckets in flight and commits once the bucket DDP
    marks last was posted and none is left."""

    def __init__(self, batch_size: float, smoothing: float = 0.0,
                 process_group: Optional[Any] = None,
                 peer: Optional[taiji.Peer] = None) -> None:
        super().__init__(process_group, peer)
        self.batch_size = batch_size
        self.smoothing = smoothing
        self.stats: Dict[str, Any] = {}
        self._grad_stats: Optional[taiji.GradStats] = None
        self._lock = threading.Lock()
        self._pending = 0
        self._last_posted = False

    def grad_stats(self) -> taiji.GradStats:
        if self._grad_stats is None:
            self._grad_stats = self.taiji_peer().grad_stats(self.batch_size, self.smoothing)
        return self._grad_stats

    @property
    def noise_scale(self) -> float:
        return float(self.stats.get("noise_scale", math.nan))

    @property
    def snr(self) -> float:
        return float(self.stats.get("snr", math.nan))

    def close(self) -> None:
        if self._grad_stats is not None:
            self._grad_stats.close()
            self._grad_stats = None


def grad_stats_hook(state: "GradStatsState",
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """:func:`allreduce_hook` that also measures the gradient noise scale and SNR in
    the same allreduce (``taiji_grad_stats``), exposed on ``state.stats``."""
    if not isinstance(state, GradStatsState):
        raise TypeError("grad_stats_hook needs a taiji.torch.hooks.GradStatsState")
    stats = state.grad_stats()
    peer = state.taiji_peer()
    tensor = bucket.buffer()
    with state._lock:
        state._pending += 1
        state._last_posted = state._last_posted or bucket.is_last()

    def then() -> None:
        with state._lock:
            state._pending -= 1
            finished = state._last_posted and state._pending == 0
            if finished:
                state._last_posted = False
        if finished:
            stats.commit()
            state.stats = stats.read()
    request = peer.allreduce_async(tensor, _bucket_name("ddp_stats", bucket), op=taiji.AVG,
                                   out=tensor, grad_stats=stats)
    return _future_of(request, tensor, then)
