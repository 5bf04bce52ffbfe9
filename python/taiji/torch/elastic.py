"""Elastic training with the Horovod-style API, as ``horovod.torch.elastic``: the job grows,
shrinks and survives lost ranks while training goes on.

    import taiji.torch as hvd
    from taiji.torch import elastic

    hvd.init()
    model, optimizer = ..., hvd.DistributedOptimizer(...)
    state = elastic.State(model, optimizer, step=0)

    @elastic.run
    def train(state):
        while state.step < total_steps:
            ...                       # one step; read hvd.rank()/hvd.size() in here
            state.step += 1
            state.commit()            # a copy to go back to, and the resize check

    train(state)

Run under ``taiji-run -np N --elastic``; ``taiji-run --resize M --store ADDR --job-id J``
asks for M ranks. At each ``state.commit()`` (or ``state.check()``) every rank takes rank
0's reading of the requested size; when it differs from ``hvd.size()`` the function is
unwound, the peer resized, the state broadcast from rank 0 to every member (the processes
the launcher started included), and the function called again. A lost rank
(``taiji.PeerLost``) makes the survivors shrink, go back to the last commit, sync and call
the function again. See docs/elastic-python.md.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, List, Optional

import torch

import taiji

from . import horovod as hvd

__all__ = ["State", "TorchState", "ResizeRequested", "run"]

class ResizeRequested(Exception):
    """Raised by :meth:`State.check` when the ranks agreed on a new size; :func:`run`
    catches it, resizes and calls the function again (Horovod's HostsUpdatedInterrupt)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the job is asked to run on {size} ranks")
        self.size = size


class State:
    """What a rank needs to go on training after a membership change: the model's state
    dict (parameters and buffers), the optimizer's state dict, and any extra values given
    as keywords, which become attributes (``State(model, opt, epoch=0)``: ``state.epoch``).

    Keeps one in-memory copy of all three (:meth:`save`, taken at construction and by
    :meth:`commit`), to go back to after a lost rank (:meth:`restore`). Extras must be
    picklable (they travel by :func:`broadcast_object`) and deep-copyable.
    """

    def __init__(self, model: Optional[torch.nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, **extra: Any) -> None:
        for name in extra:
            if name.startswith("_") or hasattr(type(self), name) or name in (
                    "model", "optimizer", "detached"):
                raise ValueError(f"State: {name!r} cannot be an extra value's name")
        self.model = model
        self.optimizer = optimizer
        self.detached = False
        self._extra_names: List[str] = list(extra)
        for name, value in extra.items():
            setattr(self, name, value)
        self._reset_callbacks: List[Callable[[], None]] = []
        self._synced_version: Optional[int] = None
        register = getattr(optimizer, "_register_hooks_once", None)
        if register is not None:
            register()  # a DistributedOptimizer made at size 1 must reduce once it grows
        self.save()

    # -- the copy ------------------------------------------------------------------------

    def save(self) -> None:
        """Keeps a copy of the model's and optimizer's state dicts and of the extras."""
        self._saved_model = (copy.deepcopy(self.model.state_dict())
                             if self.model is not None else None)
        self._saved_optimizer = (copy.deepcopy(self.optimizer.state_dict())
                                 if self.optimizer is not None else None)
        self._saved_extra = copy.deepcopy({k: getattr(self, k) for k in self._extra_names})

    def restore(self) -> None:
        """Goes back to the last :meth:`save` (or :meth:`commit`, or :meth:`sync`)."""
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._saved_optimizer))
        for name, value in copy.deepcopy(self._saved_extra).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Makes every rank's model, optimizer state and extras rank 0's, bitwise, then
        saves them. A collective: after a membership change these are the broadcasts every
        member, joiners included, posts (:func:`run` calls it)."""
        p = hvd.peer()
        if self.model is not None:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        if self._extra_names:
            extra = hvd.broadcast_object({k: getattr(self, k) for k in self._extra_names},
                                         root_rank=0, name="elastic.extra")
            for name, value in extra.items():
                setattr(self, name, value)
        version = _cluster_version(p)
        if version > 1 and version != self._synced_version:
            hvd._membership_changed()
        self._synced_version = version
        self.save()

    # -- the step boundary ---------------------------------------------------------------

    def commit(self) -> None:
        """:meth:`save`, then :meth:`check`. Call it between steps (no gradient reduction
        in flight), as often as you can afford a copy of the state."""
        self.save()
        self.check()

    def check(self) -> None:
        """Raises :class:`ResizeRequested` when a new size was asked for (rank 0 reads it
        from the store and broadcasts it, so every rank decides alike). A collective; call
        it between steps, inside a function wrapped by :func:`run`."""
        p = hvd.peer()
        wanted = torch.zeros(1, dtype=torch.int64)
        if p.rank == 0:
            wanted[0] = p.requested_size()
        p.broadcast(wanted, "elastic.requested", 0)
        size = int(wanted[0])
        if size > 0 and size != p.size:
            raise ResizeRequested(size)

    # Horovod's name.
    check_host_updates = check

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after every membership change, before the state is synced
        (rescale the learning rate by ``hvd.size()`` there). They run on the ranks that
        were members before the change; what they set on rank 0 reaches joiners through
        the sync."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()


# Horovod's name for the state of a torch model and optimizer.
TorchState = State


def _cluster_version(p: taiji.Peer) -> int:
    try:
        return p.cluster_version
    except taiji.Unsupported:
        return 1  # a library without elastic membership: the job never changes


def _lost_a_rank(p: taiji.Peer, error: taiji.TaijiError) -> bool:
    # An op that was waiting for the lost rank fails with PeerLost; others in flight may
    # fail otherwise (Aborted), with the peer's sticky error saying why.
    return isinstance(error, taiji.PeerLost) or isinstance(p.async_error(), taiji.PeerLost)


def _shrink(p: taiji.Peer) -> bool:
    # Not retried: a rank lost during the shrink cannot be told apart from a slow one by a
    # second shrink, which would wait for it until its deadline (include/taiji/taiji.h).
    return p.shrink()


def _detach(state: State, p: taiji.Peer) -> None:
    state.detached = True
    hvd.shutdown()
    p.close()  # also when init adopted the caller's peer: a detached peer takes no ops


def run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a training function ``fn(state, *args, **kwargs)`` (as Horovod's
    ``hvd.elastic.run``): the wrapper syncs the state from rank 0, calls ``fn``, and
    returns what it returns. When ``fn`` raises :class:`ResizeRequested` (from
    ``state.commit()``/``state.check()``), every rank resizes the peer; the ranks the
    shrink removed shut the Horovod-style API down and return None with
    ``state.detached`` True (they should exit); the others run the reset callbacks, sync
    (the new ranks post the same sync on entering the wrapper) and call ``fn`` again. When
    ``fn`` raises ``taiji.PeerLost`` the survivors shrink, restore the last commit, run the
    reset callbacks, sync and call ``fn`` again. Any other error propagates.

    ``fn`` resumes from the state (``state.step`` and the like), and reads ``hvd.rank()``
    and ``hvd.size()`` afresh each time it is called. Outside ``fn`` a script posts no
    collectives between ``hvd.init()`` and the call: a process that joins posts only what
    the wrapper posts."""

    @functools.wraps(fn)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        p = hvd.peer()
        resize_to = 0
        while True:
            try:
                if resize_to:
                    size, resize_to = resize_to, 0
                    changed, detached = p.resize(size)
                    if detached:
                        _detach(state, p)
                        return None
                    if changed:
                        state.on_reset()
                state.sync()
                return fn(state, *args, **kwargs)
            except ResizeRequested as request:
                resize_to = request.size
            except taiji.TaijiError as error:
                if not _lost_a_rank(p, error):
                    raise
                _shrink(p)
                state.restore()
                state.on_reset()

    return wrapper
