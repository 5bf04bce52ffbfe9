"""taiji: named, versioned, asynchronous collectives, from Python.

A thin layer over the C ABI of libtaiji (ctypes; nothing compiled). Collectives take
NumPy arrays and CPU torch tensors; torch is only touched when the caller passes a tensor.
See docs/python.md.
"""
from __future__ import annotations

from ._lib import load_library
from ._log import log_to_python, log_to_stderr
from ._types import (AVG, MAX, MIN, PROD, SUM, DType, ReduceOp, dtype_name, dtype_size,
                     reduce_op_name, to_dtype)
from .errors import (Aborted, AuthError, BootstrapError, ConfigError, Duplicate, Finalized,
                     InternalError, InvalidArgument, IOFailure, Mismatch, NoDeviceError, NoMemory, NotFoundError,
                     PeerLost,
                     ProtocolError, StaleVersion, TaijiError, Timeout, Unsupported,
                     VersionMismatch, error_class, status_name)
from .grad_stats import GradStats
from .links import LinkMatrix, optimize_topology, predict_allreduce
from .peer import Peer
from .rendezvous import RendezvousServer
from .request import Request
from .topology import Topology

__all__ = [
    "load_library", "version", "log_to_python", "log_to_stderr",
    "SUM", "PROD", "MIN", "MAX", "AVG", "ReduceOp", "DType", "dtype_name", "dtype_size",
    "reduce_op_name", "to_dtype",
    "TaijiError", "InvalidArgument", "NoMemory", "Timeout", "Mismatch", "PeerLost",
    "Duplicate", "StaleVersion", "ProtocolError", "IOFailure", "ConfigError", "Aborted",
    "Finalized", "VersionMismatch", "InternalError", "Unsupported", "BootstrapError",
    "AuthError", "NotFoundError", "NoDeviceError", "error_class", "status_name",
    "Peer", "Request", "Topology", "GradStats", "RendezvousServer",
    "LinkMatrix", "optimize_topology", "predict_allreduce",
]


def version() -> str:
    """The loaded library's version, "0.2.0"."""
    from . import _lib
    return _lib.text(_lib.lib().taiji_version_string())
