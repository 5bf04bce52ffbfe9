"""The synchronisation modes and the rules for changing between them.

These mirror ``src/adapt/sync_mode.h`` (the C core's policy engine applies the same rules
when it decides a switch), so a binding and the engine never disagree on a learning rate
or a period. Pure functions: no peer, no tensors.

    bsp    synchronous SGD: gradients allreduced every step
    sma    synchronous model averaging (KungFu SMA, CrossBow): models averaged every step
    pair   asynchronous pair averaging (AD-PSGD; Sync-Switch's ASP): each step averages with
           one random peer's latest saved model, fetched one-sidedly
    local  local SGD: models averaged every H steps (constant H, QSR, or a vote)
"""
from __future__ import annotations

import math

__all__ = ["MODES", "parse_sync_mode", "replicas_diverge", "lr_scale_for_switch",
           "qsr_period", "momentum_after_switch"]

# The order is the C enum's (SyncMode::Bsp = 0, ...): a mode travels between ranks as
# its index.
MODES = ("bsp", "sma", "pair", "local")

# sync_mode.h caps the QSR period so that a vanishing learning rate cannot overflow it.
_QSR_CAP = 1_000_000_000_000


def parse_sync_mode(text: str) -> str:
    """The mode named by ``text`` ("asp" is taken for "pair"); ValueError otherwise."""
    name = str(text).lower()
    if name == "asp":
        return "pair"
    if name not in MODES:
        raise ValueError(f"unknown synchronisation mode {text!r} (one of {', '.join(MODES)})")
    return name


def replicas_diverge(mode: str) -> bool:
    """Whether ranks' replicas may differ in ``mode``: entering BSP from one of them starts
    by averaging the replicas."""
    return parse_sync_mode(mode) != "bsp"


def lr_scale_for_switch(from_mode: str, to_mode: str, size: int) -> float:
    """Linear scaling (Goyal et al.; Sync-Switch found anything else diverges): the rate
    moves with the batch one update sees. BSP's update sees every rank's batch, the other
    modes' one rank's, so BSP -> other is 1/size and other -> BSP is size."""
    from_global = parse_sync_mode(from_mode) == "bsp"
    to_global = parse_sync_mode(to_mode) == "bsp"
    if from_global == to_global or size < 1:
        return 1.0
    return float(size) if to_global else 1.0 / float(size)


def qsr_period(lr: float, alpha: float, h_base: int) -> int:
    """QSR (Gu et al. 2023): the local-SGD period for learning rate ``lr``,
    H = max(h_base, floor((alpha / lr)^2)), h_base >= 1."""
    h_base = max(int(h_base), 1)
    if not (lr > 0) or not (alpha > 0):
        return h_base
    h = (alpha / lr) * (alpha / lr)
    if not (h < 1e12):
        return _QSR_CAP
    return max(h_base, math.floor(h))


def momentum_after_switch(configured: float, scale: float, step: int, ramp_steps: int) -> float:
    """Momentum ``step`` steps after a switch (0 at the switch), as Sync-Switch found best:
    scaled by the learning rate's factor at the switch (never above the configured value),
    then ramped linearly back to ``configured`` over ``ramp_steps`` steps."""
    start = min(max(configured * scale, 0.0), configured)
    if ramp_steps == 0 or step >= ramp_steps:
        return configured
    t = float(step) / float(ramp_steps)
    return start + (configured - start) * t
