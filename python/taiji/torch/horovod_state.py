"""Horovod's object, parameter and optimizer-state broadcasts over taiji (part of the
Horovod-style API; ``taiji.torch.horovod`` re-exports every name)."""

from __future__ import annotations

import pickle
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .horovod import (_allgather_padded, _check_root, _no_process_set, _op_name,
                      broadcast_async_, peer, rank, synchronize)

# ---- objects, parameters, optimizer state ------------------------------------------

def _dumps(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                            dtype=torch.uint8)


def _loads(data: torch.Tensor) -> Any:
    return pickle.loads(data.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """Returns root_rank's ``obj`` on every rank (pickled; Horovod uses cloudpickle, so
    lambdas and local classes do not travel here). Without ``name`` the calls are matched
    by order (Horovod defaults to the object's type name, which other ranks may not know)."""
    _no_process_set(process_set)
    p = peer()
    root_rank = _check_root(root_rank)
    base = _op_name("broadcast_object", name)
    if p.rank == root_rank:
        data = _dumps(obj)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    p.broadcast(length, base + ".len", root_rank)
    if p.rank != root_rank:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    p.broadcast(data, base, root_rank)
    return obj if p.rank == root_rank else _loads(data)


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Returns the list of every rank's ``obj`` in rank order (pickled; without ``name``
    the calls are matched by order)."""
    gathered, rows = _allgather_padded(_dumps(obj), _op_name("allgather_object", name))
    return [_loads(gathered[r, : rows[r]]) for r in range(len(rows))]


ParamsLike = Union[Dict[str, torch.Tensor], Iterable[Union[torch.Tensor,
                                                           Tuple[str, torch.Tensor]]]]


def broadcast_parameters(params: ParamsLike, root_rank: int) -> None:
    """Overwrites every rank's parameters with root_rank's, bitwise, in place.

    ``params``: ``model.state_dict()``, ``model.named_parameters()`` or
    ``model.parameters()`` (unnamed ones are matched by their order). All broadcasts are
    posted as one group, then waited for."""
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    root_rank = _check_root(root_rank)
    handles = []
    with peer().group():
        for i, (name, tensor) in enumerate(items):
            handles.append(broadcast_async_(tensor, root_rank,
                                            f"param.{name}" if name else f"param.#{i}"))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Any = None) -> None:
    """Makes every rank's optimizer state (moments, step counts, learning rates) root_rank's.

    Differs from Horovod in how: root's whole ``state_dict()`` is broadcast as one pickled
    object and loaded with ``load_state_dict`` on the other ranks, so the result is bitwise
    root's and ranks whose optimizer has not stepped yet need no dummy step (Horovod's
    in-place broadcast needs every rank to hold state of the same shapes). ``model`` is
    accepted for Horovod compatibility and not needed."""
    state = broadcast_object(optimizer.state_dict(), root_rank, name="optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)
