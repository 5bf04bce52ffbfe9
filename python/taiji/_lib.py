"""Finding libtaiji.so and declaring the C functions the package calls.

Every call goes through ``ctypes.CDLL``, which releases the GIL for the duration of the
call: blocking calls (init, collectives, finalize, destroy) must not hold it, or the I/O
thread's completion callbacks (which take the GIL) deadlock against them.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_uint32, c_uint64, c_void_p)
from typing import Any, Optional

# The header version this binding was written against (TAIJI_VERSION_NUMBER of 0.2.0);
# the library refuses a binding newer than itself or of another major version.
BINDING_HEADER_VERSION = 200

LIBRARY_ENV = "TAIJI_LIBRARY"
_SONAME = "libtaiji.so.0"

CALLBACK = CFUNCTYPE(None, c_int, c_void_p)
LOG_CALLBACK = CFUNCTYPE(None, c_int, c_char_p, c_void_p)


class Config(Structure):
    """taiji_config_t; fields only ever appended in C, so the layout is stable."""
    _fields_ = [("struct_size", c_size_t), ("rank", c_int32), ("size", c_int32),
                ("rendezvous", c_char_p), ("host_rendezvous", c_int32),
                ("listen_host", c_char_p), ("job_id", c_char_p), ("timeout_ms", c_int64),
                ("init_timeout_ms", c_int64), ("topology", c_char_p), ("settings", c_void_p)]

    def __init__(self) -> None:
        super().__init__(ctypes.sizeof(Config), -1, -1, None, -1, None, None, 0, 0, None, None)


class OpOptions(Structure):
    """taiji_op_options_t."""
    _fields_ = [("struct_size", c_size_t), ("version", c_uint64), ("timeout_ms", c_int64),
                ("callback", CALLBACK), ("user_data", c_void_p), ("topology", c_char_p),
                ("grad_stats", c_void_p), ("memory", c_int), ("stream", c_void_p)]

    def __init__(self) -> None:
        super().__init__(ctypes.sizeof(OpOptions), 0, 0, CALLBACK(), None, None, None, 0, None)


MEMORY_AUTO, MEMORY_HOST, MEMORY_DEVICE = 0, 1, 2


class GradStatsConfig(Structure):
    """taiji_grad_stats_config_t."""
    _fields_ = [("struct_size", c_size_t), ("batch_size", c_double), ("smoothing", c_double),
                ("element_variance", c_int), ("tensors_per_step", c_int)]


class GradStatsResult(Structure):
    """taiji_grad_stats_result_t."""
    _fields_ = [("struct_size", c_size_t), ("state", c_int), ("steps", c_uint64),
                ("skipped", c_uint64), ("local_sq_norm", c_double),
                ("global_sq_norm", c_double), ("g2", c_double), ("trace_sigma", c_double),
                ("noise_scale", c_double), ("snr", c_double)]


_P = c_void_p
_PP = POINTER(c_void_p)
_OPT = POINTER(OpOptions)
_S = c_int  # taiji_status_t and the other enums

# name: (restype, argtypes)
_SIGNATURES = {
    "taiji_status_name": (c_char_p, [_S]),
    "taiji_status_string": (c_char_p, [_S]),
    "taiji_version": (c_uint32, []),
    "taiji_version_string": (c_char_p, []),
    "taiji_config_set": (_S, [POINTER(Config), c_char_p, c_char_p]),
    "taiji_config_clear": (None, [POINTER(Config)]),
    "taiji_peer_init_versioned": (_S, [c_uint32, POINTER(Config), _PP]),
    "taiji_peer_finalize": (_S, [_P]),
    "taiji_peer_abort": (_S, [_P]),
    "taiji_peer_destroy": (None, [_P]),
    "taiji_peer_rank": (c_int, [_P]),
    "taiji_peer_size": (c_int, [_P]),
    "taiji_peer_async_error": (_S, [_P]),
    "taiji_peer_last_error": (c_char_p, [_P]),
    "taiji_allreduce": (_S, [_P, c_char_p, _P, _P, c_size_t, _S, _S, _OPT, _PP]),
    "taiji_broadcast": (_S, [_P, c_char_p, _P, c_size_t, _S, c_int, _OPT, _PP]),
    "taiji_barrier": (_S, [_P, c_char_p, _OPT, _PP]),
    "taiji_allgather": (_S, [_P, c_char_p, _P, _P, c_size_t, _S, _OPT, _PP]),
    "taiji_reduce": (_S, [_P, c_char_p, _P, _P, c_size_t, _S, _S, c_int, _OPT, _PP]),
    "taiji_gather": (_S, [_P, c_char_p, _P, _P, c_size_t, _S, c_int, _OPT, _PP]),
    "taiji_reduce_scatter": (_S, [_P, c_char_p, _P, _P, c_size_t, _S, _S, _OPT, _PP]),
    "taiji_consensus": (_S, [_P, c_char_p, _P, c_size_t, POINTER(c_int), _OPT, _PP]),
    "taiji_send": (_S, [_P, c_char_p, _P, c_size_t, _S, c_int, _OPT, _PP]),
    "taiji_recv": (_S, [_P, c_char_p, _P, c_size_t, _S, c_int, _OPT, _PP]),
    "taiji_peer_split": (_S, [_P, c_int, c_int, _OPT, _PP]),
    "taiji_topology_from_parents": (_S, [c_int, c_int, POINTER(c_int), POINTER(c_int), _PP]),
    "taiji_topology_from_edges": (_S, [c_int, c_int, POINTER(c_int), POINTER(c_int), _PP]),
    "taiji_topology_from_text": (_S, [_P, c_char_p, c_int, _PP]),
    "taiji_topology_text": (c_size_t, [_P, c_char_p, c_size_t]),
    "taiji_topology_digest": (c_uint64, [_P]),
    "taiji_topology_size": (c_int, [_P]),
    "taiji_topology_destroy": (None, [_P]),
    "taiji_set_topology": (_S, [_P, _P, _OPT, _PP]),
    "taiji_group_start": (_S, [_P]),
    "taiji_group_end": (_S, [_P]),
    "taiji_request_test": (_S, [_P]),
    "taiji_request_wait": (_S, [_P, c_int64]),
    "taiji_request_topology_digest": (c_uint64, [_P]),
    "taiji_request_error": (c_char_p, [_P]),
    "taiji_request_version": (c_uint64, [_P]),
    "taiji_request_free": (None, [_P]),
    "taiji_dtype_size": (c_size_t, [_S]),
    "taiji_dtype_name": (c_char_p, [_S]),
    "taiji_reduce_op_name": (c_char_p, [_S]),
    "taiji_set_log_callback": (_S, [LOG_CALLBACK, _S, c_void_p]),
    "taiji_rendezvous_start": (_S, [c_char_p, _PP]),
    "taiji_rendezvous_address": (c_size_t, [_P, c_char_p, c_size_t]),
    "taiji_rendezvous_stop": (None, [_P]),
    "taiji_metrics_json": (_S, [_P, c_char_p, c_size_t, POINTER(c_size_t)]),
    "taiji_flight_recorder_json": (_S, [_P, c_char_p, c_size_t, POINTER(c_size_t)]),
    "taiji_metrics_set_enabled": (_S, [_P, c_int]),
    "taiji_metrics_probe_rtt": (_S, [_P, c_int64]),
    "taiji_step_mark": (_S, [_P, _OPT, _PP]),
    "taiji_grad_stats_create": (_S, [_P, POINTER(GradStatsConfig), _PP]),
    "taiji_grad_stats_destroy": (None, [_P]),
    "taiji_grad_stats_set_loss_scale": (_S, [_P, c_double]),
    "taiji_grad_stats_commit": (_S, [_P]),
    "taiji_grad_stats_reset": (_S, [_P]),
    "taiji_grad_stats_read": (_S, [_P, POINTER(GradStatsResult)]),
    "taiji_grad_stats_tensor_variance": (_S, [_P, c_char_p, POINTER(c_double),
                                              POINTER(c_double)]),
    "taiji_grad_stats_state_string": (c_char_p, [_S]),
}

class Action(Structure):
    """taiji_action_t."""
    _fields_ = [("struct_size", c_size_t), ("kind", c_int), ("mode", c_int), ("size", c_int),
                ("topology", c_char_p), ("batch_scale", c_double), ("lr_scale", c_double),
                ("policy", c_char_p), ("reason", c_char_p), ("applied", c_int)]

    def __init__(self) -> None:
        super().__init__(ctypes.sizeof(Action), 0, 0, 0, None, 1.0, 1.0, None, None, 0)


class StepView(Structure):
    """taiji_step_view_t (read-only, during a policy callback)."""
    _fields_ = [("struct_size", c_size_t), ("step", c_uint64), ("size", c_int),
                ("requested_size", c_int), ("step_seconds", POINTER(c_double)),
                ("samples", POINTER(c_double)), ("link_bytes_per_second", POINTER(c_double)),
                ("stragglers", POINTER(ctypes.c_ubyte)), ("median_seconds", c_double),
                ("throughput", c_double), ("noise_scale", c_double), ("snr", c_double),
                ("sync_mode", c_int), ("total_samples", c_uint64), ("n_inputs", c_size_t),
                ("input_keys", POINTER(c_char_p)), ("inputs", POINTER(c_double))]


ADAPT_POLICY = CFUNCTYPE(c_int, POINTER(StepView), c_void_p, c_void_p)


class MeasureOptions(Structure):
    """taiji_measure_options_t (include/taiji/links.h)."""
    _fields_ = [("struct_size", c_size_t), ("probe_bytes", c_uint64),
                ("latency_rounds", c_int), ("bandwidth_rounds", c_int),
                ("timeout_ms", c_int64), ("background", c_int)]

    def __init__(self) -> None:
        super().__init__(ctypes.sizeof(MeasureOptions), 0, 0, 0, 0, 0)


class OptimizeOptions(Structure):
    """taiji_optimize_options_t (include/taiji/links.h)."""
    _fields_ = [("struct_size", c_size_t), ("bytes", c_uint64), ("chunk_bytes", c_uint64)]

    def __init__(self) -> None:
        super().__init__(ctypes.sizeof(OptimizeOptions), 0, 0)

# Declared on first use instead of at load, so that the package still loads a library that
# predates them; late() raises AttributeError naming the missing symbol.
_LATE_SIGNATURES = {
    "taiji_resize": (_S, [_P, c_int, _OPT, POINTER(c_int), POINTER(c_int)]),
    "taiji_shrink": (_S, [_P, _OPT, POINTER(c_int)]),
    "taiji_peer_cluster_version": (c_uint64, [_P]),
    "taiji_peer_joined_version": (c_uint64, [_P]),
    "taiji_peer_requested_size": (c_int, [_P]),
    "taiji_model_save": (_S, [_P, c_char_p, c_void_p, c_size_t, c_uint64, POINTER(c_uint64)]),
    "taiji_model_request": (_S, [_P, c_int, c_char_p, c_uint64, c_void_p, c_size_t, _OPT, _PP]),
    "taiji_sync_mode_name": (c_char_p, [c_int]),
    "taiji_action_kind_name": (c_char_p, [c_int]),
    "taiji_adapt_create": (_S, [_P, POINTER(c_void_p)]),
    "taiji_adapt_destroy": (None, [c_void_p]),
    "taiji_adapt_add_policy": (_S, [c_void_p, c_char_p]),
    "taiji_adapt_add_callback": (_S, [c_void_p, ADAPT_POLICY, c_void_p]),
    "taiji_action_list_add": (_S, [c_void_p, POINTER(Action)]),
    "taiji_adapt_set_grad_stats": (_S, [c_void_p, c_void_p]),
    "taiji_adapt_set_input": (_S, [c_void_p, c_char_p, c_double]),
    "taiji_adapt_set_sync_mode": (_S, [c_void_p, c_int]),
    "taiji_adapt_sync_mode": (c_int, [c_void_p]),
    "taiji_adapt_reset": (_S, [c_void_p]),
    "taiji_adapt_step": (_S, [c_void_p, c_double, c_int64, POINTER(Action), c_size_t,
                              POINTER(c_size_t)]),
    "taiji_adapt_find_bsp_fraction": (_S, [POINTER(c_double), POINTER(c_double), c_size_t,
                                           c_double, c_double, c_double, POINTER(c_double),
                                           POINTER(c_int)]),
    # include/taiji/links.h (TAIJI_0.7)
    "taiji_measure_links": (_S, [_P, POINTER(MeasureOptions), _PP]),
    "taiji_peer_links": (_S, [_P, _PP]),
    "taiji_link_matrix_create": (_S, [c_int, POINTER(c_double), POINTER(c_double), _PP]),
    "taiji_link_matrix_size": (c_int, [_P]),
    "taiji_link_bandwidth": (c_double, [_P, c_int, c_int]),
    "taiji_link_latency": (c_double, [_P, c_int, c_int]),
    "taiji_link_matrix_destroy": (None, [_P]),
    "taiji_optimize_topology": (_S, [_P, _P, POINTER(OptimizeOptions), _PP, ctypes.c_char_p,
                                     c_size_t]),
    "taiji_predict_allreduce": (c_double, [_P, _P, c_uint64]),
}


def _candidates() -> list:
    """Where to look, in order: $TAIJI_LIBRARY, the install-time LIBDIR, a build tree above
    the package, then the system loader's search path."""
    found = []
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [env]  # an explicit choice is never second-guessed
    try:
        from . import _install_paths  # written at install time; absent in the source tree
        found.append(os.path.join(_install_paths.LIBDIR, _SONAME))
    except ImportError:
        pass
    here = pathlib.Path(__file__).resolve().parent
    for parent in here.parents:
        lib = parent / "build" / "capi" / "libtaiji.so"
        if lib.exists():
            found.append(str(lib))
            break
    found.append(_SONAME)
    return found


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libtaiji once per process and returns it (later calls return the same one).

    ``path`` overrides the lookup; otherwise: env ``TAIJI_LIBRARY``, the installed
    ``taiji._install_paths.LIBDIR``, ``<repo>/build/capi/libtaiji.so`` above the package,
    then ``libtaiji.so.0`` through the system loader. Raises OSError naming every place tried.
    """
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for candidate in ([path] if path else _candidates()):
            if os.sep in candidate and not os.path.exists(candidate):
                tried.append(f"{candidate} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as exc:
                tried.append(f"{candidate} ({exc})")
                continue
            _declare(lib)
            _lib = lib
            return lib
        raise OSError("cannot load libtaiji: tried " + "; ".join(tried))


def _declare(lib: ctypes.CDLL) -> None:
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """The loaded library (loading it on first use)."""
    return _lib if _lib is not None else load_library()


_late: dict = {}


def late(name: str) -> Any:
    """The function ``name`` of _LATE_SIGNATURES, declared on first use. Raises
    AttributeError when the loaded library does not export it (it is older)."""
    fn = _late.get(name)
    if fn is None:
        restype, argtypes = _LATE_SIGNATURES[name]
        fn = getattr(lib(), name)
        fn.restype = restype
        fn.argtypes = argtypes
        _late[name] = fn
    return fn


def text(value: Optional[bytes]) -> str:
    return value.decode("utf-8", "replace") if value else ""
