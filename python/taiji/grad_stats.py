"""taiji.GradStats: gradient noise scale and SNR measured inside the allreduce."""
from __future__ import annotations

import ctypes
import math
import weakref
from typing import Any, Dict, Optional, Tuple

from . import _lib
from .errors import check

STATES = {0: "defined", 1: "single_peer", 2: "no_samples", 3: "no_signal", 4: "no_noise"}


class GradStats:
    """Made by :meth:`taiji.Peer.grad_stats`; pass it as ``grad_stats=`` to allreduces of
    float gradients (SUM or AVG). See docs/gradient-statistics.md for the estimates."""

    def __init__(self, peer: Any, batch_size: float, smoothing: float = 0.0,
                 element_variance: bool = False, tensors_per_step: int = 0) -> None:
        config = _lib.GradStatsConfig(ctypes.sizeof(_lib.GradStatsConfig), float(batch_size),
                                      float(smoothing), int(bool(element_variance)),
                                      int(tensors_per_step))
        handle = ctypes.c_void_p()
        check(_lib.lib().taiji_grad_stats_create(peer._handle, ctypes.byref(config),
                                                 ctypes.byref(handle)), peer.last_error)
        self._peer = peer  # the object refers to its peer
        self._handle = handle
        self._closer = weakref.finalize(self, _lib.lib().taiji_grad_stats_destroy, handle)

    def _c_handle(self) -> ctypes.c_void_p:
        if not self._closer.alive:
            raise ValueError("the GradStats object is closed")
        return self._handle

    def _check(self, status: int) -> None:
        check(status, self._peer.last_error)

    def commit(self) -> None:
        """Ends a step (call it once every attached allreduce of the step completed)."""
        self._check(_lib.lib().taiji_grad_stats_commit(self._c_handle()))

    def reset(self) -> None:
        self._check(_lib.lib().taiji_grad_stats_reset(self._c_handle()))

    def set_loss_scale(self, scale: float) -> None:
        self._check(_lib.lib().taiji_grad_stats_set_loss_scale(self._c_handle(), float(scale)))

    def read(self) -> Dict[str, Any]:
        """The estimates: state (a name from STATES), state_text, steps, skipped,
        local_sq_norm, global_sq_norm, g2, trace_sigma, noise_scale, snr."""
        out = _lib.GradStatsResult()
        out.struct_size = ctypes.sizeof(_lib.GradStatsResult)
        self._check(_lib.lib().taiji_grad_stats_read(self._c_handle(), ctypes.byref(out)))
        result: Dict[str, Any] = {name: getattr(out, name) for name, _ in out._fields_[2:]}
        result["state"] = STATES.get(out.state, str(out.state))
        result["state_text"] = _lib.text(_lib.lib().taiji_grad_stats_state_string(out.state))
        return result

    def tensor_variance(self, name: str) -> Tuple[float, float]:
        """(L2 norm, sum) of the element-wise variance across peers of the tensor reduced
        under ``name`` at its last step (needs element_variance=True)."""
        l2, total = ctypes.c_double(math.nan), ctypes.c_double(math.nan)
        self._check(_lib.lib().taiji_grad_stats_tensor_variance(
            self._c_handle(), name.encode("utf-8"), ctypes.byref(l2), ctypes.byref(total)))
        return l2.value, total.value

    def close(self) -> None:
        """Releases the object (allreduces still running keep what they need)."""
        self._closer()

    def __enter__(self) -> "GradStats":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
