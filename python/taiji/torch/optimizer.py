"""Horovod's DistributedOptimizer over taiji: gradients allreduced, asynchronously and
in flat buckets of small ones, as backward produces them.

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

# Gradients are packed into flat buckets of up to this many bytes, each reduced by one
# allreduce as soon as all of its gradients are ready (see docs/python-horovod.md for the
# measurement behind it); 0 posts one allreduce per parameter.
DEFAULT_BUCKET_BYTES = 1 << 20


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
                 gradient_predivide_factor, groups, sparse_as_dense, grad_stats, bucket_bytes):
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
        # Parameters reduced together as one flat allreduce, and how many are ready.
        self._p_to_bucket: Dict[torch.Tensor, Tuple[torch.Tensor, ...]] = {}
        self._bucket_ready: Dict[Tuple[torch.Tensor, ...], int] = {}
        self._make_buckets(groups, bucket_bytes)
        if hvd.size() > 1:
            self._register_hooks()

    # -- setup ---------------------------------------------------------------------------

    def _make_buckets(self, groups, bucket_bytes: int) -> None:
        trainable = [p for group in self.param_groups for p in group["params"]
                     if p.requires_grad]
        if groups is not None and groups != 0:
            # Every rank must form the same groups: order by name, which ranks agree on.
            trainable.sort(key=lambda p: self._parameter_names[p])
            p_groups = self._explicit_groups(groups, trainable)
        elif bucket_bytes > 0:
            # Backward produces gradients roughly in reverse order of the parameters, so
            # buckets filled in that order complete one after another while it runs.
            p_groups = [list(reversed(trainable))]
        else:
            return
        for members in p_groups:
            for bucket in self._split_by_size(members, bucket_bytes if groups is None
                                              or groups == 0 else 0):
                if len(bucket) > 1:
                    key = tuple(bucket)
                    for p in bucket:
                        self._p_to_bucket[p] = key
                    self._bucket_ready[key] = 0

    @staticmethod
    def _explicit_groups(groups, trainable) -> List[List[torch.Tensor]]:
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups must be a positive integer or a list of lists")
            return _split_list(trainable, groups)
        if not isinstance(groups, list):
            raise ValueError("groups must be a positive integer or a list of lists")
        wanted = {id(p) for p in trainable}
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
                if id(p) in wanted:
                    members.append(p)
            if members:
                p_groups.append(members)
        return p_groups + [[p] for p in trainable if id(p) not in seen]

    @staticmethod
    def _split_by_size(members, cap: int) -> List[List[torch.Tensor]]:
        """Buckets of one dtype each (a flat buffer has one), of at most ``cap`` bytes when
        cap > 0 (a larger tensor is a bucket of its own), in the members' order."""
        open_buckets: Dict[torch.dtype, List[torch.Tensor]] = {}
        sizes: Dict[torch.dtype, int] = {}
        out = []
        for p in members:
            nbytes = p.numel() * p.element_size()
            bucket = open_buckets.get(p.dtype)
            if bucket is not None and cap > 0 and sizes[p.dtype] + nbytes > cap:
                out.append(bucket)
                bucket = None
            if bucket is None:
                bucket = open_buckets[p.dtype] = []
                sizes[p.dtype] = 0
            bucket.append(p)
            sizes[p.dtype] += nbytes
        return out + list(open_buckets.values())

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    # The gradient accumulator's hook runs once p.grad holds the sum.
                    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _register_hooks_once(self) -> None:
        # For a job whose size may change (taiji.torch.elastic): reduce even at size 1, as
        # Horovod's optimizer does under HOROVOD_ELASTIC.
        if not self._grad_accs:
            self._register_hooks()

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
        for key in self._bucket_ready:
            self._bucket_ready[key] = 0
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

    def _bucket_allreduce_async(self, members: Sequence[torch.Tensor]) -> Tuple[int, Any]:
        pairs = [self._compression.compress(self._dense_grad(p)) for p in members]
        flat = torch.cat([c.reshape(-1) for c, _ in pairs])
        pre, post = self._scale_factors()
        name = f"bucket.{self._parameter_names[members[0]]}.{len(members)}"
        handle = hvd._allreduce_async(flat, None, name, self.op, None, pre, post,
                                      **self._opts())
        return handle, [ctx for _, ctx in pairs]

    def _make_hook(self, p: torch.Tensor):
        def hook(*ignore):
            key = self._p_to_bucket.get(p)
            posted = (p in self._handles and self._handles[p][0] is not None) or (
                key is not None and key in self._handles)
            if posted:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "gradients were computed more than backward_passes_per_step times "
                        "before step(); increase backward_passes_per_step to accumulate "
                        "gradients locally")
            self._allreduce_delay[p] -= 1
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                if key is not None:
                    self._bucket_ready[key] += 1
                    if self._bucket_ready[key] == len(key):
                        self._handles[key] = self._bucket_allreduce_async(key)
                        for q in key:
                            self._handles.pop(q, None)
                        self._bucket_ready[key] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    # -- completing ----------------------------------------------------------------------

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce (posting those whose hook has not fired,
        e.g. with fewer backward passes than backward_passes_per_step, or a parameter that
        got no gradient) and puts the reduced gradients in place."""
        posted = set()
        for key, (handle, _) in self._handles.items():
            if handle is not None:
                posted.update(key) if isinstance(key, tuple) else posted.add(key)
        for p in self._requires_update - posted:
            key = self._p_to_bucket.get(p)
            if key is None:
                self._handles[p] = self._allreduce_grad_async(p)
            elif key not in posted:
                self._handles[key] = self._bucket_allreduce_async(key)
                posted.update(key)
                for q in key:
                    self._handles.pop(q, None)
        try:
            for key, (handle, ctx) in self._handles.items():
                output = hvd.synchronize(handle)
                if isinstance(key, tuple):
                    start = 0
                    for p, c in zip(key, ctx):
                        n = p.grad.numel()
                        self._finish(p, output[start:start + n].view_as(p.grad), c)
                        start += n
                    self._bucket_ready[key] = 0
                else:
                    self._finish(key, output, ctx)
        finally:
            self._handles.clear()
        if self._grad_stats is not None:
            self._grad_stats.commit()
        self._synchronized = True

    def _finish(self, p: torch.Tensor, output: torch.Tensor, ctx: Any) -> None:
        self._allreduce_delay[p] = self.backward_passes_per_step
        reduced = self._compression.decompress(output, ctx)
        if reduced.data_ptr() != p.grad.data_ptr():  # not reduced in place
            p.grad.copy_(reduced)

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
                         process_set: Any = None, grad_stats: Any = None,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES):
    """Wraps ``optimizer``: each gradient's allreduce is posted (asynchronously) as soon as
    backward has produced it, or, for small gradients, as soon as its bucket is complete;
    ``step()`` waits for all, puts the reduced gradients in place and steps the wrapped
    optimizer.

    Arguments are Horovod's: ``named_parameters`` (usually ``model.named_parameters()``;
    names match the ops across ranks, so every rank must use the same names; without them,
    names follow the parameters' order), ``compression`` (``Compression.none``, ``fp16``,
    ``bf16``), ``backward_passes_per_step`` (gradients of that many backward passes are
    summed locally before one allreduce), ``op`` (Average, Sum, Min, Max; Adasum raises),
    ``gradient_predivide_factor`` (Average only: scale by 1/f before and f/size() after),
    ``groups`` (an int: that many groups of parameters in name order, or a list of lists
    of parameters; each group, per dtype, is reduced as one flat allreduce once all its
    gradients are ready), ``sparse_as_dense``. ``synchronize()``,
    ``skip_synchronize()`` and ``zero_grad()`` behave as Horovod's.

    taiji additions and differences: ``bucket_bytes`` (without ``groups``: gradients, in
    reverse parameter order, are packed into flat buckets of one dtype and at most this
    many bytes, one allreduce each; a larger tensor is reduced alone, in place; 0: one
    allreduce per parameter, named after it). ``grad_stats`` (a ``taiji.GradStats`` of the
    default peer, made with ``tensors_per_step=0``) rides in every gradient allreduce and
    is committed once per synchronize(); it needs op Average or Sum. ``process_set`` must
    be None. ``num_groups`` is Horovod's deprecated spelling of ``groups``.
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
    if not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError("bucket_bytes must be an int >= 0")
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, grad_stats,
               bucket_bytes)
