"""Synchronisation modes for a torch optimizer over taiji's primitives.

Each mode adds work around the wrapped optimizer's own ``step`` (``before_update`` runs
after backward, ``after_update`` after the parameters moved) and may do a collective when
it is entered; every rank enters a mode at the same step. The wrappers:

    SynchronousSGDOptimizer(opt)              bsp: the gradients averaged by one flat allreduce
    SynchronousAveragingOptimizer(opt, alpha) sma: models averaged, then the local gradient
    PairAveragingOptimizer(opt)               pair: average with a random peer's saved model
    LocalSGDOptimizer(opt, period=H)          local: models averaged every H steps
    LocalSGDOptimizer(opt, qsr_alpha=a)       local, H = max(h_base, floor((a/lr)^2))
    LocalSGDOptimizer(opt, vote_delta=d)      local, averaged when a rank's gradient changed

``taiji.torch.AdaptiveOptimizer`` runs the same mode objects and changes between them.
``DistributedOptimizer`` stays the BSP path that overlaps the allreduce with backward;
this one reduces once after backward so that it can be switched off between two steps.
See docs/python-adaptive.md.
"""
from __future__ import annotations

import random
from typing import Any, Dict, List, Optional

import torch

import taiji

from .sync_rules import parse_sync_mode, qsr_period

__all__ = ["SyncOptimizer", "SynchronousSGDOptimizer", "SynchronousAveragingOptimizer",
           "PairAveragingOptimizer", "LocalSGDOptimizer", "make_mode"]


def _resolve_peer(peer: Optional[taiji.Peer]) -> taiji.Peer:
    if peer is not None:
        return peer
    from . import horovod
    return horovod.peer()


class _Flat:
    """All parameters as one flat buffer: one collective per step instead of one per
    tensor, and the single entry pair averaging keeps in the model store."""

    def __init__(self, params: List[torch.Tensor]) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise TypeError("the synchronisation modes need parameters of one float dtype, "
                            f"got {sorted(str(d) for d in dtypes)}")
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.dtype = params[0].dtype

    def empty(self) -> torch.Tensor:
        return torch.empty(self.numel, dtype=self.dtype)

    def params_flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def grads_flat(self) -> torch.Tensor:
        # A parameter without a gradient is reduced as zeros, as DistributedOptimizer does.
        return torch.cat([torch.zeros(p.numel(), dtype=self.dtype) if p.grad is None
                          else p.grad.detach().reshape(-1) for p in self.params])

    def _scatter(self, flat: torch.Tensor, targets) -> None:
        offset = 0
        with torch.no_grad():
            for p, t in zip(self.params, targets):
                n = p.numel()
                if t is not None:
                    t.copy_(flat[offset:offset + n].view_as(t))
                offset += n

    def set_params(self, flat: torch.Tensor) -> None:
        self._scatter(flat, self.params)

    def set_grads(self, flat: torch.Tensor) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._scatter(flat, [p.grad for p in self.params])


class Mode:
    """One synchronisation mode of one optimizer. ``enter`` is collective (every rank calls
    it at the same step); ``before_update``/``after_update`` bracket the optimizer's step."""

    name = ""

    def __init__(self, optimizer: torch.optim.Optimizer, peer: taiji.Peer, prefix: str) -> None:
        self.optimizer = optimizer
        self.peer = peer
        self.prefix = prefix
        self.flat = _Flat([p for g in optimizer.param_groups for p in g["params"]])

    def enter(self, from_mode: Optional[str]) -> None:
        pass

    def before_update(self) -> None:
        pass

    def after_update(self) -> None:
        pass

    def average_models(self) -> torch.Tensor:
        """Replaces every rank's parameters by their mean (collective); returns it."""
        flat = self.flat.params_flat()
        self.peer.allreduce(flat, f"{self.prefix}.average", op=taiji.AVG, out=flat)
        self.flat.set_params(flat)
        return flat


def _state_tensors(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]):
    """The optimizer's float state (momentum buffers, Adam's moments), in an order every rank
    agrees on: parameter order, then key."""
    out = []
    for p in params:
        state = optimizer.state.get(p, {})
        for key in sorted(state):
            v = state[key]
            if torch.is_tensor(v) and v.is_floating_point():
                out.append(v)
    return out


class BSP(Mode):
    """Synchronous SGD: the mean gradient over ranks, then the optimizer's step; replicas
    stay bitwise equal because every rank applies the same reduced bytes."""

    name = "bsp"

    def __init__(self, optimizer, peer, prefix, grad_stats: Optional[taiji.GradStats] = None):
        super().__init__(optimizer, peer, prefix)
        self.grad_stats = grad_stats

    def enter(self, from_mode: Optional[str]) -> None:
        # Replicas that trained apart are averaged (parameters and optimizer state); the
        # broadcast then makes them bitwise equal whatever order the sums were taken in.
        tensors = self.flat.params + _state_tensors(self.optimizer, self.flat.params)
        buf = torch.cat([t.detach().reshape(-1).to(self.flat.dtype) for t in tensors])
        if from_mode is not None:
            self.peer.allreduce(buf, f"{self.prefix}.enter.average", op=taiji.AVG, out=buf)
        self.peer.broadcast(buf, f"{self.prefix}.enter.broadcast", 0)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(buf[offset:offset + n].view_as(t))
                offset += n

    def before_update(self) -> None:
        grads = self.flat.grads_flat()
        opts = {} if self.grad_stats is None else {"grad_stats": self.grad_stats}
        self.peer.allreduce(grads, f"{self.prefix}.bsp.grads", op=taiji.AVG, out=grads, **opts)
        if self.grad_stats is not None:
            self.grad_stats.commit()
        self.flat.set_grads(grads)


class SMA(Mode):
    """Synchronous model averaging (KungFu's SynchronousAveragingOptimizer, CrossBow): each
    step every replica moves towards the average model by ``alpha``, then applies its own
    gradient, computed at the replica before the move (KungFu's order)."""

    name = "sma"

    def __init__(self, optimizer, peer, prefix, alpha: float = 0.1):
        super().__init__(optimizer, peer, prefix)
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = float(alpha)

    def before_update(self) -> None:
        local = self.flat.params_flat()
        mean = self.peer.allreduce(local, f"{self.prefix}.sma.models", op=taiji.AVG)
        self.flat.set_params(local.mul_(1.0 - self.alpha).add_(mean, alpha=self.alpha))


class Pair(Mode):
    """Pair averaging (AD-PSGD; KungFu's PairAveragingOptimizer): pull a random other rank's
    latest model from its store, average it with ours, apply the local gradient, save the
    result for the others. The request is one-sided: the other rank's I/O thread serves it,
    so a slow rank slows only those that happen to pick it."""

    name = "pair"

    def __init__(self, optimizer, peer, prefix, seed: Optional[int] = None):
        super().__init__(optimizer, peer, prefix)
        self.key = f"{prefix}.pair.model"
        self.rng = random.Random(None if seed is None else seed * 7919 + peer.rank)
        self.other = self.flat.empty()
        self.requests = 0

    def enter(self, from_mode: Optional[str]) -> None:
        # Everyone's model is in its store before anyone asks: the first request of the
        # first step then cannot miss.
        self.peer.model_save(self.key, self.flat.params_flat())
        self.peer.barrier(f"{self.prefix}.pair.enter")

    def target(self) -> int:
        size, rank = self.peer.size, self.peer.rank
        t = self.rng.randrange(size)
        return (t + 1) % size if t == rank else t

    def before_update(self) -> None:
        if self.peer.size < 2:
            return
        self.peer.model_request(self.target(), self.key, self.other)
        self.requests += 1
        local = self.flat.params_flat()
        self.flat.set_params(local.add_(self.other).mul_(0.5))

    def after_update(self) -> None:
        self.peer.model_save(self.key, self.flat.params_flat())


class Local(Mode):
    """Local SGD: every rank steps on its own and the models are averaged when one of three
    rules says so. ``period=H``: every H steps. ``qsr_alpha=a``: QSR, H recomputed from the
    current learning rate (first group's) after each averaging, so the period grows as the
    rate decays. ``vote_delta=d``: SelSync, every step each rank measures the relative change
    of its (smoothed) squared gradient norm; the maximum over ranks is allreduced, so all
    ranks take the same decision, and the models are averaged when it reaches d."""

    name = "local"

    def __init__(self, optimizer, peer, prefix, period: Optional[int] = None,
                 qsr_alpha: Optional[float] = None, h_base: int = 1,
                 vote_delta: Optional[float] = None, smoothing: float = 0.9):
        super().__init__(optimizer, peer, prefix)
        rules = [x is not None for x in (period, qsr_alpha, vote_delta)]
        if sum(rules) > 1:
            raise ValueError("give one of period, qsr_alpha and vote_delta")
        if period is None and qsr_alpha is None and vote_delta is None:
            period = 4
        if period is not None and int(period) < 1:
            raise ValueError("period must be >= 1")
        self.fixed = None if period is None else int(period)
        self.qsr_alpha, self.h_base = qsr_alpha, max(int(h_base), 1)
        self.vote_delta, self.smoothing = vote_delta, float(smoothing)
        self.since = 0
        self.averagings = 0
        self.period = self._next_period()
        self._norm: Optional[float] = None
        self._change = 0.0

    def _next_period(self) -> int:
        if self.qsr_alpha is not None:
            return qsr_period(self.optimizer.param_groups[0]["lr"], self.qsr_alpha, self.h_base)
        return self.fixed or 0

    def enter(self, from_mode: Optional[str]) -> None:
        self.since = 0
        self.period = self._next_period()
        self._norm = None

    def before_update(self) -> None:
        if self.vote_delta is None:
            return
        sq = float(self.flat.grads_flat().double().square().sum())
        previous = self._norm
        self._norm = sq if previous is None else (
            self.smoothing * previous + (1.0 - self.smoothing) * sq)
        self._change = 0.0 if not previous else abs(self._norm - previous) / previous

    def after_update(self) -> None:
        self.since += 1
        if self.vote_delta is not None:
            # MAX is exact in any order: every rank gets the same bytes, hence the same vote.
            vote = torch.tensor([self._change], dtype=torch.float64)
            self.peer.allreduce(vote, f"{self.prefix}.local.vote", op=taiji.MAX, out=vote)
            due = float(vote[0]) >= self.vote_delta
        else:
            due = self.since >= self.period
        if due:
            self.average_models()
            self.averagings += 1
            self.since = 0
            self.period = self._next_period()


_MODES = {"bsp": BSP, "sma": SMA, "pair": Pair, "local": Local}


def make_mode(name: str, optimizer: torch.optim.Optimizer, peer: Optional[taiji.Peer] = None,
              prefix: str = "sync", **options: Any) -> Mode:
    """The mode object ``name`` ("bsp", "sma", "pair"/"asp", "local") with its options."""
    return _MODES[parse_sync_mode(name)](optimizer, _resolve_peer(peer), prefix, **options)


class SyncOptimizer:
    """A torch optimizer run under one synchronisation mode. Construction is collective:
    rank 0's parameters are broadcast and the mode is entered, so all modes start from the
    same model. ``step``, ``zero_grad``, ``param_groups``, ``state`` and the state dicts are
    the wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "bsp",
                 peer: Optional[taiji.Peer] = None, prefix: str = "sync",
                 **options: Any) -> None:
        self.optimizer = optimizer
        self.peer = _resolve_peer(peer)
        self.impl = make_mode(mode, optimizer, self.peer, prefix, **options)
        # BSP's entry is exactly the start every mode needs: rank 0's model everywhere.
        start = self.impl if isinstance(self.impl, BSP) else BSP(optimizer, self.peer, prefix)
        start.enter(None)
        if start is not self.impl:
            self.impl.enter(None)

    @property
    def mode(self) -> str:
        return self.impl.name

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._begin_update()
        self.impl.before_update()
        self.optimizer.step()
        self.impl.after_update()
        return loss

    def _begin_update(self) -> None:
        """Runs after backward, before the mode's first collective of the step (a subclass
        may change the mode here)."""

    def average_models(self) -> None:
        """Collective: every rank's parameters become the mean model (the model to evaluate
        after training in a mode whose replicas differ)."""
        self.impl.average_models()


def SynchronousSGDOptimizer(optimizer, peer=None, grad_stats=None, prefix="sync"):
    """BSP: gradients averaged over ranks every step (see :class:`BSP`)."""
    return SyncOptimizer(optimizer, "bsp", peer, prefix, grad_stats=grad_stats)


def SynchronousAveragingOptimizer(optimizer, alpha=0.1, peer=None, prefix="sync"):
    """SMA: models averaged every step with weight ``alpha`` (see :class:`SMA`)."""
    return SyncOptimizer(optimizer, "sma", peer, prefix, alpha=alpha)


def PairAveragingOptimizer(optimizer, peer=None, seed=None, prefix="sync"):
    """AD-PSGD pair averaging over the model store (see :class:`Pair`)."""
    return SyncOptimizer(optimizer, "pair", peer, prefix, seed=seed)


def LocalSGDOptimizer(optimizer, period=None, qsr_alpha=None, h_base=1, vote_delta=None,
                      peer=None, prefix="sync"):
    """Local SGD with periodic averaging (see :class:`Local` for the three rules)."""
    return SyncOptimizer(optimizer, "local", peer, prefix, period=period, qsr_alpha=qsr_alpha,
                         h_base=h_base, vote_delta=vote_delta)
