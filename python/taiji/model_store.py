"""The model store (include/taiji/model_store.h): a rank saves its model into its own
peer, and any rank fetches it one-sidedly, served by the owner's I/O thread while the
owner's Python code computes. Used through :meth:`taiji.Peer.model_save`,
:meth:`taiji.Peer.model_request` and :meth:`taiji.Peer.model_request_async`.

A model is bytes to the store: any C-contiguous CPU buffer the package takes (a NumPy
array, a CPU torch tensor) or a bytes-like object (``bytes`` to save; ``bytearray`` or a
writable ``memoryview`` to fetch into). The requester's buffer must hold exactly the saved
number of bytes (else :class:`taiji.Mismatch`).
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict

import numpy as np

from . import _buffers, _lib
from .errors import check

# What a model request takes of a collective's options: the version is an argument, and
# neither a topology nor gradient statistics mean anything here.
_OPTIONS = ("timeout_ms", "callback")


class _Bytes:
    """ptr and nbytes of a model buffer; holds the object (and any view of it)."""
    __slots__ = ("obj", "view", "ptr", "nbytes")

    def __init__(self, obj: Any, role: str, writable: bool) -> None:
        self.obj = obj
        if isinstance(obj, np.ndarray) or _buffers.is_tensor(obj):
            b = _buffers.as_output(obj, role) if writable else _buffers.as_input(obj, role)
            self.view, self.ptr, self.nbytes = b, b.ptr, b.nbytes
            return
        if not isinstance(obj, (bytes, bytearray, memoryview)):
            raise TypeError(f"{role}: expected a numpy.ndarray, a CPU torch.Tensor or a "
                            f"bytes-like object, got {type(obj).__name__}")
        view = memoryview(obj)
        if not view.c_contiguous:
            raise TypeError(f"{role}: the buffer must be C-contiguous")
        if writable and view.readonly:
            raise ValueError(f"{role}: the buffer is read-only (pass a bytearray)")
        array = np.frombuffer(view, dtype=np.uint8) if view.nbytes else np.empty(0, np.uint8)
        self.view, self.nbytes = array, int(view.nbytes)
        self.ptr = array.ctypes.data if self.nbytes else None


def _model_name(name: Any) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return name.encode("utf-8")


def _version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"version must be an int, got {type(version).__name__}")
    if version < 0:
        raise ValueError("version must be >= 0")
    return version


def save(peer: Any, name: str, x: Any, version: int = 0) -> int:
    """Copies x into peer's store under name; returns the version saved."""
    n = _model_name(name)
    v = _version(version)
    buf = _Bytes(x, "x", writable=False)
    saved = ctypes.c_uint64(0)
    check(_lib.late("taiji_model_save")(peer._handle, n, buf.ptr, buf.nbytes, v,
                                        ctypes.byref(saved)), peer.last_error)
    return int(saved.value)


def request(peer: Any, rank: int, name: str, out: Any, version: int, opts: Dict[str, Any],
            is_async: bool) -> Any:
    """Fetches rank's model into out: out itself, or a Request whose result is out."""
    n = _model_name(name)
    v = _version(version)
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"rank must be an int, got {type(rank).__name__}")
    unknown = set(opts) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"model_request: unknown option(s) {', '.join(sorted(unknown))}")
    buf = _Bytes(out, "out", writable=True)
    fn = _lib.late("taiji_model_request")
    return peer._post("model_request", name, lambda h, o, r: fn(
        h, rank, n, v, buf.ptr, buf.nbytes, o, r), [buf], lambda: out, opts, is_async)
