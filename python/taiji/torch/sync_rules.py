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

__all__ = ["MODES", "LR_RULES", "parse_sync_mode", "replicas_diverge", "lr_scale_for_switch",
           "momentum_scale_for_switch", "qsr_period", "momentum_after_switch"]

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


LR_RULES = ("average", "linear")


def lr_scale_for_switch(from_mode: str, to_mode: str, size: int, rule: str = "average") -> float:
    """Linear scaling (Goyal et al.; Sync-Switch found anything else diverges): the rate
    moves with the batch one update of the shared model sees, and ``rule`` says which model
    that is (sync_mode.h's LrRule). "average": the ranks' average, as in every mode here; a
    rank's step moves it by 1/size of itself, which is what BSP's rate gives per rank's
    batch, so the rate stays (1). "linear": Sync-Switch's parameter server, where each
    worker's update reaches the one model whole: BSP -> other is 1/size, other -> BSP size."""
    if rule not in LR_RULES:
        raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)}, got {rule!r}")
    return momentum_scale_for_switch(from_mode, to_mode, size) if rule == "linear" else 1.0


def momentum_scale_for_switch(from_mode: str, to_mode: str, size: int) -> float:
    """The momentum's factor at a switch: the linear one under either learning-rate rule
    (asynchrony acts as momentum itself; Sync-Switch scaled the explicit one down, then
    ramped it back)."""
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
    scaled by ``scale`` (momentum_scale_for_switch; never above the configured value),
    then ramped linearly back to ``configured`` over ``ramp_steps`` steps."""
    start = min(max(configured * scale, 0.0), configured)
    if ramp_steps == 0 or step >= ramp_steps:
        return configured
    t = float(step) / float(ramp_steps)
    return start + (configured - start) * t
