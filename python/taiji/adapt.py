"""taiji.adapt: adaptation policies evaluated identically on every rank at each step.

A thin layer over ``taiji_adapt_*`` (include/taiji/adapt.h); docs/adaptive.md is the guide::

    from taiji.adapt import Engine, Action, StepView
    eng = Engine(peer, grad_stats=None)
    eng.add("sync_switch_online", k=1.5, m=5)   # a built-in by name
    eng.add(my_policy)                          # my_policy(view: StepView) -> list[Action]
    eng.set_input("loss", 0.5)                  # this rank's custom input for the next step
    for action in eng.step(samples=64):         # a collective: every rank, once per step
        ...

Every rank gets the same actions at the same step. Topology changes come back applied;
resize and sync-mode changes are for the caller to apply; batch advice is advice.
"""
from __future__ import annotations

import ctypes
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _lib
from .errors import check

__all__ = ["Engine", "Action", "StepView", "find_bsp_fraction", "SYNC_MODES", "ACTION_KINDS"]

SYNC_MODES = ("bsp", "sma", "pair", "local")
ACTION_KINDS = ("set_topology", "resize", "set_sync_mode", "advise_batch", "measure_links")
# TAIJI_ERR_INTERNAL: what a Python policy that raised returns to the C engine; the
# exception itself is re-raised by Engine.step.
_POLICY_RAISED = -14


@dataclass
class Action:
    """One decision. ``kind``: one of ACTION_KINDS. ``mode`` (set_sync_mode), ``size``
    (resize), ``topology`` (set_topology: a built-in name or the explicit text form),
    ``batch_scale`` and ``lr_scale`` (advise_batch; lr_scale also with set_sync_mode).
    A measure_links action is applied by the step: ``topology`` is the one it swapped to,
    or empty when it kept the one in force, and ``reason`` says why.
    ``policy`` and ``applied`` are filled by the engine."""
    kind: str
    mode: str = "bsp"
    size: int = 0
    topology: str = ""
    batch_scale: float = 1.0
    lr_scale: float = 1.0
    policy: str = ""
    reason: str = ""
    applied: bool = False


@dataclass
class StepView:
    """The gathered step, identical on every rank. Lists have one entry per rank."""
    step: int
    samples: List[float]
    size: int
    step_seconds: List[float]
    stragglers: List[bool]
    median_seconds: float
    throughput: float
    noise_scale: float
    snr: float
    link_bytes_per_second: List[float]
    requested_size: int
    sync_mode: str
    total_samples: int = 0
    inputs: Dict[str, List[float]] = field(default_factory=dict)


PythonPolicy = Callable[[StepView], Optional[Sequence[Action]]]


def _view(c: _lib.StepView) -> StepView:
    n = c.size
    inputs = {}
    for k in range(c.n_inputs):
        key = _lib.text(c.input_keys[k])
        inputs[key] = [c.inputs[k * n + r] for r in range(n)]
    return StepView(step=c.step, samples=[c.samples[r] for r in range(n)], size=n,
                    step_seconds=[c.step_seconds[r] for r in range(n)],
                    stragglers=[bool(c.stragglers[r]) for r in range(n)],
                    median_seconds=c.median_seconds, throughput=c.throughput,
                    noise_scale=c.noise_scale, snr=c.snr,
                    link_bytes_per_second=[c.link_bytes_per_second[r] for r in range(n)],
                    requested_size=c.requested_size, sync_mode=SYNC_MODES[c.sync_mode],
                    total_samples=c.total_samples, inputs=inputs)


def _mode_number(mode: str) -> int:
    name = "pair" if mode == "asp" else mode
    if name not in SYNC_MODES:
        raise ValueError(f"unknown sync mode {mode!r} (one of {', '.join(SYNC_MODES)})")
    return SYNC_MODES.index(name)


def _spec_value(value: Any) -> str:
    """A keyword argument as the spec string writes it: lists of names joined by '/'
    (candidates), {step: size} as STEP:SIZE,... (schedule)."""
    if isinstance(value, dict):
        return ",".join(f"{int(k)}:{int(v)}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return "/".join(str(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


class Engine:
    """Adaptation policies for one peer (taiji_adapt_create). Use from one thread; every
    rank adds the same policies in the same order and steps once per training step."""

    def __init__(self, peer: Any, grad_stats: Any = None) -> None:
        handle = ctypes.c_void_p()
        check(_lib.late("taiji_adapt_create")(peer._handle, ctypes.byref(handle)),
              peer.last_error)
        self._peer = peer
        self._handle = handle
        self._callbacks: list = []  # the ctypes thunks must live as long as the engine
        self._raised: Optional[BaseException] = None
        self._grad_stats = None
        self._closer = weakref.finalize(self, _lib.late("taiji_adapt_destroy"), handle)
        if grad_stats is not None:
            self.set_grad_stats(grad_stats)

    def _c(self) -> ctypes.c_void_p:
        if not self._closer.alive:
            raise ValueError("the adaptation engine is closed")
        return self._handle

    def _check(self, status: int) -> None:
        check(status, self._peer.last_error)

    def add(self, policy: Union[str, PythonPolicy], **params: Any) -> None:
        """Adds a built-in by name with its parameters as keywords
        (``add("adaptive_topology", threshold=0.8, window=10, candidates=["slow_leaf",
        "ring"])``), or a Python policy: a callable taking a StepView and returning the
        Actions it proposes (it runs on the thread that calls step, and must decide from
        the view alone so that every rank decides the same). Raises InvalidArgument for an
        unknown policy or parameter."""
        if isinstance(policy, str):
            spec = " ".join([policy] + [f"{k}={_spec_value(v)}" for k, v in params.items()])
            self._check(_lib.late("taiji_adapt_add_policy")(self._c(), spec.encode()))
            return
        if params:
            raise TypeError("parameters are for built-in policies only")
        if not callable(policy):
            raise TypeError("a policy is a built-in's name or a callable")
        thunk = _lib.ADAPT_POLICY(self._make_callback(policy))
        self._check(_lib.late("taiji_adapt_add_callback")(self._c(), thunk, None))
        self._callbacks.append(thunk)

    def _make_callback(self, fn: PythonPolicy) -> Callable[..., int]:
        add = _lib.late("taiji_action_list_add")

        def call(view_ptr: Any, actions: Any, _user: Any) -> int:
            try:
                proposed = fn(_view(view_ptr.contents)) or []
                for a in proposed:
                    c = _lib.Action()
                    if a.kind not in ACTION_KINDS:
                        raise ValueError(f"unknown action kind {a.kind!r}")
                    c.kind = ACTION_KINDS.index(a.kind)
                    c.mode = _mode_number(a.mode)
                    c.size = int(a.size)
                    topology = a.topology.encode()
                    reason = a.reason.encode()
                    c.topology = topology
                    c.batch_scale = float(a.batch_scale)
                    c.lr_scale = float(a.lr_scale)
                    c.reason = reason
                    status = add(actions, ctypes.byref(c))
                    if status != 0:
                        raise ValueError(f"action refused: {a!r}")
                return 0
            except BaseException as exc:  # re-raised by step(); never crosses into C
                self._raised = exc
                return _POLICY_RAISED

        return call

    def set_grad_stats(self, grad_stats: Any) -> None:
        """Rank 0's noise scale and SNR from this taiji.GradStats (None detaches) go into
        every step's view, for batch_advice."""
        ptr = grad_stats._c_handle() if grad_stats is not None else None
        self._check(_lib.late("taiji_adapt_set_grad_stats")(self._c(), ptr))
        self._grad_stats = grad_stats  # it must outlive its use here

    def set_input(self, key: str, value: float) -> None:
        """This rank's custom input for the next step; every rank sets the same keys, or
        the step raises Mismatch on every rank."""
        self._check(_lib.late("taiji_adapt_set_input")(self._c(), key.encode(), float(value)))

    def step(self, samples: float, timeout_ms: Optional[int] = None) -> List[Action]:
        """The step's collective (every rank, once per step; it replaces Peer.step_mark):
        returns the actions every rank decided, set_topology already applied. Blocks up to
        timeout_ms (None: the peer's default). Raises the peer's errors, Mismatch for
        ranks at different steps or with other input keys, or what a Python policy raised."""
        actions = (_lib.Action * 4)()
        for a in actions:
            a.struct_size = ctypes.sizeof(_lib.Action)
        n = ctypes.c_size_t(0)
        self._raised = None
        status = _lib.late("taiji_adapt_step")(self._c(), float(samples), int(timeout_ms or 0),
                                               actions, len(actions), ctypes.byref(n))
        if self._raised is not None:
            raised, self._raised = self._raised, None
            raise raised
        self._check(status)
        out = []
        for a in actions[:min(n.value, len(actions))]:
            out.append(Action(kind=ACTION_KINDS[a.kind], mode=SYNC_MODES[a.mode], size=a.size,
                              topology=_lib.text(a.topology), batch_scale=a.batch_scale,
                              lr_scale=a.lr_scale, policy=_lib.text(a.policy),
                              reason=_lib.text(a.reason), applied=bool(a.applied)))
        return out

    @property
    def sync_mode(self) -> str:
        """The mode in force as the engine knows it: "bsp", "sma", "pair" or "local"."""
        return SYNC_MODES[_lib.late("taiji_adapt_sync_mode")(self._c())]

    def set_sync_mode(self, mode: str) -> None:
        """Tells the engine the mode training runs in (every rank the same, same step)."""
        self._check(_lib.late("taiji_adapt_set_sync_mode")(self._c(), _mode_number(mode)))

    def reset(self) -> None:
        """Restarts every policy's baselines (after a resize or a switch)."""
        self._check(_lib.late("taiji_adapt_reset")(self._c()))

    def close(self) -> None:
        """Frees the engine (also done when it is collected). Idempotent."""
        self._closer()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def find_bsp_fraction(history: Sequence[tuple], bsp_accuracy: float, tolerance: float = 0.0,
                      resolution: float = 0.0625) -> tuple:
    """Sync-Switch's binary search for a recurring job: ``history`` holds (fraction,
    final accuracy) of the runs so far. Returns (fraction, done): the next fraction of the
    samples to train under BSP before switching to ASP, or, when done, the smallest one
    whose accuracy was within ``tolerance`` of BSP's."""
    if not (0 < resolution <= 1) or math.isnan(bsp_accuracy):
        raise ValueError("resolution must be in (0, 1] and bsp_accuracy a number")
    n = len(history)
    fractions = (ctypes.c_double * max(n, 1))(*[float(f) for f, _ in history])
    accuracies = (ctypes.c_double * max(n, 1))(*[float(a) for _, a in history])
    out = ctypes.c_double(0)
    done = ctypes.c_int(0)
    check(_lib.late("taiji_adapt_find_bsp_fraction")(fractions, accuracies, n,
                                                     float(bsp_accuracy), float(tolerance),
                                                     float(resolution), ctypes.byref(out),
                                                     ctypes.byref(done)))
    return out.value, bool(done.value)
