"""Horovod's DistributedOptimizer over taiji: one named async allreduce per gradient.

The wrapper becomes a subclass of the wrapped optimizer's class, as in Horovod, so
``isinstance(opt, torch.optim.SGD)`` still holds and the optimizer's own ``step`` runs on
the reduced gradients.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from . import horovod as hvd

__all__ = ["DistributedOptimizer"]


def _split_list(items: List[Any], parts: int) -> List[List[Any]]:
    step, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        if end > start:
            out.append(items[start:end])
        start = end
    return out


class _DistributedOptimizer(torch.optim.Optimizer):
    # Only __dict__ of this class is used: it is copied into a subclass of the wrapped
    # optimizer's class, so super(self.__class__, self) is that optimizer.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, grad_stats):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [(f"noname.{i}.{j}", p) for i, group in enumerate(self.param_groups)
                     for j, p in enumerate(group["params"])]
        if any(not isinstance(item, tuple) for item in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) "
                             "tuples, usually model.named_parameters()")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError("parameter names in named_parameters must be unique; "
                             f"duplicates: {', '.join(dups)}")
        unnamed = {id(p) for p in all_params} - {id(p) for _, p in named}
        if unnamed:
            raise ValueError("named_parameters was given but does not name every parameter "
                             f"of the optimizer ({len(unnamed)} unnamed)")
        self._parameter_names = {p: n for n, p in sorted(named, key=lambda item: item[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in named}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._grad_stats = grad_stats
        self._handles: Dict[Any, Tuple[Optional[int], Any]] = {}
        self._grad_accs: List[Any] = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._p_to_group: Dict[torch.Tensor, Tuple[torch.Tensor, ...]] = {}
        self._group_counts: Dict[Tuple[torch.Tensor, ...], int] = {}
        self._make_groups(groups)
        if hvd.size() > 1:
            self._register_hooks()

    # -- setup ---------------------------------------------------------------------------

    def _make_groups(self, groups) -> None:
        if groups is None or groups == 0:
            return
        trainable = [p for group in self.param_groups for p in group["params"]
                     if p.requires_grad]
        # Every rank must form the same groups: order by name, which ranks agree on.
        trainable.sort(key=lambda p: self._parameter_names[p])
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a positive integer or a list of lists")
            p_groups = _split_list(trainable, groups)
        elif isinstance(groups, list):
            seen = set()
            p_groups = []
            for inner in groups:
                members = []
                for p in inner:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor")
                    if id(p) in seen:
                        raise ValueError("a parameter can only appear once in groups")
                    seen.add(id(p))
                    if p.requires_grad:
                        members.append(p)
                if members:
                    p_groups.append(members)
            p_groups += [[p] for p in trainable if id(p) not in seen]
        else:
            raise ValueError("groups must be a positive integer or a list of lists")
        for members in p_groups:
            key = tuple(members)
            for p in members:
                self._p_to_group[p] = key
            self._group_counts[key] = 0

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    # The gradient accumulator's hook runs once p.grad holds the sum.
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    # -- posting -------------------------------------------------------------------------

    def _scale_factors(self) -> Tuple[float, float]:
        if self.op is hvd.Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            # Another rank may have a gradient for p: every rank must post it.
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                raise NotImplementedError("sparse gradients are not supported; pass "
                                          "sparse_as_dense=True")
            p.grad = p.grad.to_dense()
        return p.grad

    def _opts(self) -> Dict[str, Any]:
        return {} if self._grad_stats is None else {"grad_stats": self._grad_stats}

    def _allreduce_grad_async(self, p: torch.Tensor) -> Tuple[int, Any]:
        compressed, ctx = self._compression.compress(self._dense_grad(p))
        pre, post = self._scale_factors()
        handle = hvd._allreduce_async(compressed, None, self._parameter_names[p], self.op,
                                      None, pre, post, **self._opts())
        return handle, ctx

    def _grouped_allreduce_grad_async(self, members: Sequence[torch.Tensor]):
        pairs = [self._compression.compress(self._dense_grad(p)) for p in members]
        pre, post = self._scale_factors()
        inner = []
        with hvd.peer().group():
            for p, (compressed, _) in zip(members, pairs):
                inner.append(hvd._allreduce_async(compressed, None, self._parameter_names[p],
                                                  self.op, None, pre, post, **self._opts()))
        return inner, [ctx for _, ctx in pairs]

    def _make_hook(self, p: torch.Tensor):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "gradients were computed more than backward_passes_per_step times "
                        "before step(); increase backward_passes_per_step to accumulate "
                        "gradients locally")
            self._allreduce_delay[p] -= 1
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                if self._p_to_group:
                    key = self._p_to_group[p]
                    self._group_counts[key] += 1
                    if self._group_counts[key] == len(key):
                        self._handles[key] = self._grouped_allreduce_grad_async(key)
                        for q in key:
                            self._handles.pop(q, None)
                        self._group_counts[key] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    # -- completing ----------------------------------------------------------------------

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce (posting those whose hook has not fired,
        e.g. with fewer backward passes than backward_passes_per_step) and puts the reduced
        gradients in place."""
        done = set()
        for key in self._handles:
            done.update(key) if isinstance(key, tuple) else done.add(key)
        for p in self._requires_update - done:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for key, (handle, ctx) in self._handles.items():
                if isinstance(key, tuple):
                    for p, h, c in zip(key, handle, ctx):
                        self._finish(p, hvd.synchronize(h), c)
                    self._group_counts[key] = 0
                else:
                    self._finish(key, hvd.synchronize(handle), ctx)
                    if key in self._p_to_group:
                        self._group_counts[self._p_to_group[key]] = 0
        finally:
            self._handles.clear()
        if self._grad_stats is not None:
            self._grad_stats.commit()
        self._synchronized = True

    def _finish(self, p: torch.Tensor, output: torch.Tensor, ctx: Any) -> None:
        self._allreduce_delay[p] = self.backward_passes_per_step
        reduced = self._compression.decompress(output, ctx)
        if reduced is not p.grad:
            p.grad.set_(reduced)

    @contextmanager
    def skip_synchronize(self):
        """Inside it, step() does not synchronize (after an explicit synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced twice")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(): the "
                                 "gradients are still being reduced")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: type = hvd.Compression.none,
                         backward_passes_per_step: int = 1, op: Any = hvd.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None, grad_stats: Any = None):
    """Wraps ``optimizer``: each gradient is allreduced (one named async taiji allreduce per
    parameter) as soon as backward has produced it; ``step()`` waits for all, puts the
    reduced gradients in place and steps the wrapped optimizer.

    Arguments are Horovod's: ``named_parameters`` (usually ``model.named_parameters()``;
    names match the ops across ranks, so every rank must use the same names; without them,
    names follow the parameters' order), ``compression`` (``Compression.none``, ``fp16``,
    ``bf16``), ``backward_passes_per_step`` (gradients of that many backward passes are
    summed locally before one allreduce), ``op`` (Average, Sum, Min, Max; Adasum raises),
    ``gradient_predivide_factor`` (Average only: scale by 1/f before and f/size() after),
    ``groups`` (an int: that many groups of parameters in name order, or a list of lists
    of parameters; a group's allreduces are posted together, as one taiji group, once all
    its gradients are ready), ``sparse_as_dense``. ``synchronize()``,
    ``skip_synchronize()`` and ``zero_grad()`` behave as Horovod's.

    taiji additions and differences: ``grad_stats`` (a ``taiji.GradStats`` of the default
    peer, made with ``tensors_per_step=0``) rides in every gradient's allreduce and is
    committed once per synchronize(); it needs op Average or Sum. ``process_set`` must be
    None. ``num_groups`` is Horovod's deprecated spelling of ``groups``.
    """
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    hvd._taiji_op(op)  # rejects Adasum and foreign values with a clear error
    if gradient_predivide_factor != 1.0 and op is not hvd.Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    if process_set is not None:
        raise NotImplementedError("process sets are not supported; use taiji.Peer.split")
    if grad_stats is not None and op not in (hvd.Average, hvd.Sum):
        raise ValueError("grad_stats needs op=Average or op=Sum")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups", DeprecationWarning)
        groups = num_groups if groups is None else groups
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, grad_stats)
