"""AdaptiveOptimizer: a torch optimizer whose synchronisation mode changes during training.

    opt = AdaptiveOptimizer(torch.optim.SGD(...), mode="bsp", batch_size=16)
    opt.switch_at(samples=20_000, mode="pair")       # a schedule (Sync-Switch offline)
    opt.switch_mode("sma")                           # collective: every rank, same step
    opt = AdaptiveOptimizer(sgd, batch_size=16, engine=taiji.adapt.Engine(peer))
                                                     # the engine's actions (online)

A switch happens between two steps that every rank agrees on: a schedule counts samples,
which every rank counts alike; ``switch_mode`` checks with a consensus that every rank
asked for the same mode; an engine's actions are the same list on every rank by
construction. At a switch (docs/python-adaptive.md has the numbers behind each rule):

* entering BSP averages the replicas and their optimizer state and broadcasts rank 0's
  result, so every rank's parameters are bitwise equal;
* the learning rate moves with the batch one update sees (linear rule,
  sync_rules.lr_scale_for_switch): x1/size leaving BSP, x size entering it;
* momentum (groups that have one) follows ``momentum_policy``: "scale" (default) scales it by
  the learning rate's factor and ramps it linearly back to the configured value over
  ``ramp_steps`` steps; "keep" leaves it; "reset" zeroes the momentum buffers;
* the monitors start afresh: ``grad_stats.reset()`` and ``engine.reset()``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

import taiji

from .sync_modes import Mode, SyncOptimizer, _resolve_peer, make_mode
from .sync_rules import (LR_RULES, MODES, lr_scale_for_switch, momentum_after_switch,
                         momentum_scale_for_switch, parse_sync_mode)

__all__ = ["AdaptiveOptimizer", "Switch"]

MOMENTUM_POLICIES = ("scale", "keep", "reset")


@dataclass
class Switch:
    """One change of mode: where it happened, why, and what it cost."""
    step: int
    samples: int
    from_mode: str
    to_mode: str
    lr_scale: float
    reason: str
    seconds: float


class AdaptiveOptimizer(SyncOptimizer):
    """Runs ``optimizer`` under one of the modes of taiji.torch.sync_modes and switches in
    place. ``batch_size`` is this rank's batch per step (the same on every rank);
    ``samples`` counts them over the cluster. ``mode_options`` maps a mode to the options of
    its object (``{"local": {"period": 8}, "sma": {"alpha": 0.5}}``). Construction is
    collective and starts every rank from rank 0's model.

    With an ``engine``, ``samples`` is the engine's running total, the same on every rank
    at the same engine step; under pair averaging, where the ranks do not wait for each
    other, the engine is consulted every ``check_seconds`` instead of every step, so end a
    training loop on ``samples`` (every rank sees the same) rather than on ``steps``.

    ``lr_rule`` is how the learning rate follows a switch (sync_rules.lr_scale_for_switch):
    "average" (the default) keeps it, since in every mode here the model is the ranks'
    average and averaging already divides each rank's step by the size; "linear" divides
    it by the size leaving BSP and multiplies it back entering BSP, as Sync-Switch does for
    a parameter server's asynchronous SGD."""

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "bsp", *,
                 batch_size: int, peer: Optional[taiji.Peer] = None, engine: Any = None,
                 grad_stats: Optional[taiji.GradStats] = None, momentum_policy: str = "scale",
                 ramp_steps: int = 50, mode_options: Optional[Dict[str, Dict[str, Any]]] = None,
                 prefix: str = "adaptive", check_seconds: float = 0.5,
                 lr_rule: str = "average") -> None:
        if momentum_policy not in MOMENTUM_POLICIES:
            raise ValueError(f"momentum_policy must be one of {', '.join(MOMENTUM_POLICIES)}")
        if int(batch_size) < 1:
            raise ValueError("batch_size must be >= 1")
        if lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}")
        self.lr_rule = lr_rule
        if not check_seconds > 0:
            raise ValueError("check_seconds must be > 0")
        self.batch_size = int(batch_size)
        self.engine = engine
        self.check_seconds = float(check_seconds)
        # Under pair averaging the engine is consulted on a clock (see _engine_step).
        self._clock: Optional[Tuple[float, int, int]] = None  # (origin, checks, samples since)
        self.grad_stats = grad_stats
        self.momentum_policy = momentum_policy
        self.ramp_steps = int(ramp_steps)
        self.steps = 0
        self.samples = 0
        self.switches: List[Switch] = []
        # advise_batch actions of the last step, for the caller to apply (apply_batch_advice).
        self.batch_advice: List[Any] = []
        self._prefix = prefix
        self._options = {parse_sync_mode(k): dict(v) for k, v in (mode_options or {}).items()}
        self._modes: Dict[str, Mode] = {}
        self._schedule: List[Tuple[int, str]] = []
        # The momentum each group was configured with: the ramp's end.
        self._configured = [g.get("momentum") for g in optimizer.param_groups]
        self._ramp: Optional[Tuple[float, int]] = None  # (scale, steps since the switch)
        peer = _resolve_peer(peer)
        self._mode_ids = torch.zeros(1, dtype=torch.int64)
        super().__init__(optimizer, mode, peer, prefix, **self._mode_kwargs(parse_sync_mode(mode)))
        self._modes[self.impl.name] = self.impl
        if engine is not None:
            if engine.sync_mode != self.impl.name:
                engine.set_sync_mode(self.impl.name)
            # The engine's running total is the same on every rank at the same engine step,
            # also under pair averaging, where ranks train at their own pace: it is what
            # `samples` reports, so schedules and loop ends agree.
            self._agreed_samples = 0
            engine.add(self._observe_samples)

    def _observe_samples(self, view: Any) -> list:
        self._agreed_samples = int(view.total_samples)
        return []

    def _mode_kwargs(self, name: str) -> Dict[str, Any]:
        kwargs = dict(self._options.get(name, {}))
        if name == "bsp" and self.grad_stats is not None:
            kwargs.setdefault("grad_stats", self.grad_stats)
        return kwargs

    def _mode(self, name: str) -> Mode:
        # One object per mode for the whole run: pair keeps its random stream and its
        # store entry's name, local its counters.
        if name not in self._modes:
            self._modes[name] = make_mode(name, self.optimizer, self.peer, self._prefix,
                                          **self._mode_kwargs(name))
        return self._modes[name]

    # -- requests ------------------------------------------------------------------------

    def switch_at(self, samples: int, mode: str) -> None:
        """Switch to ``mode`` at the first step that starts with ``samples`` or more samples
        processed (cluster-wide). Every rank must schedule the same switches."""
        self._schedule.append((int(samples), parse_sync_mode(mode)))
        self._schedule.sort(key=lambda item: item[0])

    def switch_mode(self, mode: str, reason: str = "requested") -> Optional[Switch]:
        """Collective: switch now. Raises ValueError on every rank when the ranks asked for
        different modes (nothing changes then)."""
        name = parse_sync_mode(mode)
        self._mode_ids[0] = MODES.index(name)
        if not self.peer.consensus(self._mode_ids, f"{self._prefix}.switch.agree"):
            raise ValueError(f"ranks asked for different modes (this rank: {name})")
        return self._switch(name, reason)

    # -- the step ------------------------------------------------------------------------

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        self.steps += 1
        if self.engine is None:
            self.samples += self.batch_size * self.peer.size
        else:
            self.samples = self._agreed_samples
        return loss

    def _begin_update(self) -> None:
        while self._schedule and self.samples >= self._schedule[0][0]:
            _, name = self._schedule.pop(0)
            self._switch(name, f"scheduled at {self.samples} samples")
        if self.engine is not None:
            self._engine_step()
        self._apply_momentum()

    def _engine_step(self) -> None:
        # Here, after backward and before the step's first collective: the engine measures
        # a rank's step from the end of one engine step to the start of the next, leaving out
        # the wait in its own gather. A BSP allreduce between the two would make every rank
        # wait for the slowest and hide the straggler the online policy looks for.
        samples = self.batch_size
        if self.impl.name == "pair":
            # Pair averaging lets no rank wait for another, and an engine step every step
            # would (it is a collective): consult the engine on a clock instead. The k-th
            # check is due check_seconds x k after entering the mode, on every rank, so
            # the ranks' k-th checks meet within one slow step of each other, and a check
            # reports the samples this rank trained since the last one (the policies
            # compare ranks per sample).
            origin, checks, pending = self._clock or (time.monotonic(), 0, 0)
            pending += samples
            if time.monotonic() < origin + (checks + 1) * self.check_seconds:
                self._clock = (origin, checks, pending)
                return
            self._clock = (origin, checks + 1, 0)
            samples = pending
        actions = self.engine.step(samples=samples)
        self.batch_advice = [a for a in actions if a.kind == "advise_batch"]
        for action in actions:
            if action.kind == "set_sync_mode":
                self._switch(parse_sync_mode(action.mode),
                             f"{action.policy}: {action.reason}".strip(": "))

    def apply_batch_advice(self, action: Any) -> int:
        """Applies an ``advise_batch`` action: the batch per rank is scaled by its
        batch_scale (rounded, at least 1) and the learning rate by its lr_scale. Returns the
        new batch size, which the caller's data loader must then use on every rank."""
        self.batch_size = max(1, int(round(self.batch_size * action.batch_scale)))
        for group in self.optimizer.param_groups:
            group["lr"] *= action.lr_scale
        return self.batch_size

    # -- switching -----------------------------------------------------------------------

    def _switch(self, name: str, reason: str) -> Optional[Switch]:
        old = self.impl.name
        if name == old:
            return None
        start = time.monotonic()
        new = self._mode(name)
        scale = lr_scale_for_switch(old, name, self.peer.size, self.lr_rule)
        for group in self.optimizer.param_groups:
            group["lr"] *= scale
        momentum_scale = momentum_scale_for_switch(old, name, self.peer.size)
        if self.momentum_policy == "reset":
            for state in self.optimizer.state.values():
                if "momentum_buffer" in state and torch.is_tensor(state["momentum_buffer"]):
                    state["momentum_buffer"].zero_()
        elif self.momentum_policy == "scale" and momentum_scale != 1.0:
            self._ramp = (momentum_scale, 0)
        # Entering BSP averages replicas and optimizer state and makes them bitwise equal;
        # entering pair saves every rank's model before anyone requests one.
        new.enter(old)
        self.impl = new
        self._clock = (time.monotonic(), 0, 0) if name == "pair" else None
        if self.grad_stats is not None:
            self.grad_stats.reset()
        if self.engine is not None:
            if self.engine.sync_mode != name:
                self.engine.set_sync_mode(name)
            self.engine.reset()
        record = Switch(self.steps, self.samples, old, name, scale, reason,
                        time.monotonic() - start)
        self.switches.append(record)
        return record

    def _apply_momentum(self) -> None:
        if self._ramp is None:
            return
        scale, k = self._ramp
        for group, configured in zip(self.optimizer.param_groups, self._configured):
            if configured is not None and "momentum" in group:
                group["momentum"] = momentum_after_switch(configured, scale, k,
                                                          self.ramp_steps)
        self._ramp = None if k >= self.ramp_steps else (scale, k + 1)

    @property
    def momentum(self) -> Optional[float]:
        """The first group's momentum now (None without one)."""
        return self.optimizer.param_groups[0].get("momentum")

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]
