"""taiji.LinkMatrix and the topology optimiser (include/taiji/links.h; docs/topologies.md).

A matrix is directed: entry (src, dst) is what src measured sending to dst, bandwidth in
bytes per second and latency in seconds (one way). The diagonal is 0; 0 elsewhere is a link
not measured. Matrices come from :meth:`taiji.Peer.measure_links`, :meth:`taiji.Peer.links`
or :meth:`LinkMatrix.from_lists`, and are immutable.

The C functions are bound on first use, so the package still imports against a library
that predates them; calling one then raises :class:`taiji.Unsupported`.
"""
from __future__ import annotations

import ctypes
import math
import numbers
import weakref
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _lib
from .errors import InvalidArgument, Unsupported, check
from .topology import Topology

_ERR_INVALID_ARGUMENT = -1
_ERR_UNSUPPORTED = -15
_UINT64_MAX = (1 << 64) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# taiji_optimize_topology cuts its line to the buffer and cannot say how long it was.
_EXPLANATION_BYTES = 1 << 16


def _fn(name: str) -> Any:
    try:
        return _lib.late(name)
    except AttributeError:
        from . import version
        raise Unsupported(_ERR_UNSUPPORTED, f"the loaded libtaiji {version()} has no {name}: "
                                            "link measurement needs a newer library") from None


def _int_in(value: Any, what: str, low: int, high: int) -> int:
    """``value`` as an int in [low, high]: TypeError for a non-int, InvalidArgument for one
    the C field cannot hold (ctypes would wrap it silently)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    value = int(value)
    if not low <= value <= high:
        raise InvalidArgument(_ERR_INVALID_ARGUMENT, f"{what} must be {low} to {high}, "
                                                     f"got {value}")
    return value


def _square(values: Any, what: str) -> Tuple[int, List[float]]:
    """(n, the n*n entries row-major as floats) of an n x n indexable of numbers."""
    if isinstance(values, np.ndarray):
        if values.ndim != 2 or values.shape[0] != values.shape[1]:
            raise InvalidArgument(_ERR_INVALID_ARGUMENT,
                                  f"{what} must be n x n, got shape {values.shape}")
        if values.dtype.kind not in "biuf":
            raise TypeError(f"{what}: entries must be real numbers, got dtype {values.dtype}")
        flat = np.ascontiguousarray(values, dtype=np.float64).ravel().tolist()
        return values.shape[0], flat
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be n x n rows of numbers, got {type(values).__name__}")
    try:
        n = len(values)
    except TypeError:
        raise TypeError(f"{what} must be n x n rows of numbers, "
                        f"got {type(values).__name__}") from None
    flat: List[float] = []
    for i in range(n):
        row = values[i]
        if isinstance(row, (str, bytes)):
            raise TypeError(f"{what}: row {i} is not a row of numbers")
        try:
            width = len(row)
        except TypeError:
            raise InvalidArgument(_ERR_INVALID_ARGUMENT,
                                  f"{what} must be n x n: row {i} is not a row") from None
        if width != n:
            raise InvalidArgument(_ERR_INVALID_ARGUMENT,
                                  f"{what} must be n x n: {n} rows, row {i} has {width} entries")
        for j in range(n):
            v = row[j]
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{what}[{i}][{j}] must be a real number, "
                                f"got {type(v).__name__}")
            flat.append(float(v))
    return n, flat


def _first_bad(n: int, flat: List[float], what: str) -> Optional[str]:
    for k, v in enumerate(flat):
        if not math.isfinite(v) or v < 0:
            return f"{what}[{k // n}][{k % n}] is {v}: entries must be finite and >= 0"
    return None


class LinkMatrix:
    """An immutable n x n matrix of links (see the module's text). Owns a
    ``taiji_link_matrix_t*``, freed by :meth:`close` (or when collected)."""

    def __init__(self, handle: ctypes.c_void_p) -> None:
        """Takes ownership of a matrix handle; use the class method or the Peer's calls."""
        if not isinstance(handle, ctypes.c_void_p) or not handle.value:
            raise ValueError("LinkMatrix needs a matrix handle")
        self._handle: Optional[ctypes.c_void_p] = handle
        self._size = int(_fn("taiji_link_matrix_size")(handle))
        self._closer = weakref.finalize(self, _fn("taiji_link_matrix_destroy"), handle)

    @classmethod
    def from_lists(cls, bandwidth: Any, latency: Any = None) -> "LinkMatrix":
        """A matrix from n x n rows (nested lists, or anything indexable such as a 2-D
        NumPy array): bandwidth in bytes/s, latency in seconds (None: all 0). The
        diagonal is stored as 0. InvalidArgument for n < 1, rows that are not n x n (or
        latency of another size), and an entry that is negative or not finite; TypeError
        for an entry that is not a real number."""
        n, bw = _square(bandwidth, "bandwidth")
        if n < 1:
            raise InvalidArgument(_ERR_INVALID_ARGUMENT, "a link matrix needs at least 1 rank")
        lat: Optional[List[float]] = None
        if latency is not None:
            m, lat = _square(latency, "latency")
            if m != n:
                raise InvalidArgument(_ERR_INVALID_ARGUMENT,
                                      f"latency is {m} x {m}, bandwidth {n} x {n}")
        if n > _INT_MAX:
            raise InvalidArgument(_ERR_INVALID_ARGUMENT, f"{n} ranks is too many")
        count = n * n
        bw_arr = (ctypes.c_double * count)(*bw)
        lat_arr = (ctypes.c_double * count)(*lat) if lat is not None else None
        handle = ctypes.c_void_p()
        status = _fn("taiji_link_matrix_create")(n, bw_arr, lat_arr, ctypes.byref(handle))
        # The C call leaves no error text: say which entry it refused.
        check(status, lambda: (_first_bad(n, bw, "bandwidth")
                               or (_first_bad(n, lat, "latency") if lat is not None else None)
                               or f"taiji_link_matrix_create refused a {n} x {n} matrix"))
        return cls(handle)

    def _c_handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("the LinkMatrix is closed")
        return self._handle

    def close(self) -> None:
        """Frees the C matrix. Idempotent; any other call afterwards raises ValueError."""
        self._handle = None
        self._closer()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "LinkMatrix":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def size(self) -> int:
        """The number of ranks n."""
        self._c_handle()
        return self._size

    def __len__(self) -> int:
        return self.size

    def _rank(self, value: Any, what: str) -> int:
        value = _int_in(value, what, _INT_MIN, _INT_MAX)
        if not 0 <= value < self._size:
            raise IndexError(f"{what} {value} is not a rank of a {self._size}-rank matrix")
        return value

    def bandwidth(self, src: int, dst: int) -> float:
        """Bytes per second that src measured sending to dst (0 on the diagonal and for a
        link not measured). IndexError for a rank out of range."""
        h = self._c_handle()
        return float(_fn("taiji_link_bandwidth")(h, self._rank(src, "src"),
                                                 self._rank(dst, "dst")))

    def latency(self, src: int, dst: int) -> float:
        """One-way seconds from src to dst (0 on the diagonal and for a link not
        measured). IndexError for a rank out of range."""
        h = self._c_handle()
        return float(_fn("taiji_link_latency")(h, self._rank(src, "src"),
                                               self._rank(dst, "dst")))

    def _rows(self, name: str) -> List[List[float]]:
        h = self._c_handle()
        fn = _fn(name)
        n = self._size
        return [[float(fn(h, s, d)) for d in range(n)] for s in range(n)]

    def bandwidth_rows(self) -> List[List[float]]:
        """The bandwidth matrix as n lists of n floats (row src, column dst)."""
        return self._rows("taiji_link_bandwidth")

    def latency_rows(self) -> List[List[float]]:
        """The latency matrix as n lists of n floats (row src, column dst)."""
        return self._rows("taiji_link_latency")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinkMatrix):
            return NotImplemented
        return (self.size == other.size and self.bandwidth_rows() == other.bandwidth_rows()
                and self.latency_rows() == other.latency_rows())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self._handle is None:
            return "<taiji.LinkMatrix closed>"
        return f"<taiji.LinkMatrix size={self._size}>"


def _matrix_arg(matrix: Any) -> LinkMatrix:
    if not isinstance(matrix, LinkMatrix):
        raise TypeError(f"expected a taiji.LinkMatrix, got {type(matrix).__name__}")
    return matrix


def optimize_topology(matrix: LinkMatrix, bytes: int = 0, chunk_bytes: int = 0,
                      peer: Any = None) -> Tuple[Topology, str]:
    """The strategy the cost model predicts fastest for an allreduce of ``bytes`` (0:
    16 MiB) over the links of ``matrix``, pipelined in ``chunk_bytes`` chunks (0: the
    peer's chunk size, or 1 MiB), as ``(topology, explanation)``. The explanation is one
    line naming the winner, its predicted time and bottleneck, and the next best
    candidates. From the same matrix every rank gets the same topology, ready for
    :meth:`taiji.Peer.set_topology`. With ``peer`` the matrix must have its size. Never
    blocks. InvalidArgument for a matrix of another size than the peer's job."""
    matrix = _matrix_arg(matrix)
    options = _lib.OptimizeOptions()
    options.bytes = _int_in(bytes, "bytes", 0, _UINT64_MAX)
    options.chunk_bytes = _int_in(chunk_bytes, "chunk_bytes", 0, _UINT64_MAX)
    peer_handle = None
    if peer is not None:
        from .peer import Peer
        if not isinstance(peer, Peer):
            raise TypeError(f"peer must be a taiji.Peer or None, got {type(peer).__name__}")
        peer_handle = peer._handle
    handle = ctypes.c_void_p()
    line = ctypes.create_string_buffer(_EXPLANATION_BYTES)
    status = _fn("taiji_optimize_topology")(peer_handle, matrix._c_handle(),
                                            ctypes.byref(options), ctypes.byref(handle),
                                            line, _EXPLANATION_BYTES)
    # The C call writes its error text into the explanation, not the peer's last error.
    check(status, lambda: _lib.text(line.value) or "taiji_optimize_topology failed")
    return Topology(handle), _lib.text(line.value)


def predict_allreduce(topology: Topology, matrix: LinkMatrix, bytes: int) -> float:
    """The cost model's predicted seconds for an allreduce of ``bytes`` on ``topology``
    over the links of ``matrix`` (the model assumes 1 MiB chunks). InvalidArgument when
    their sizes differ."""
    if not isinstance(topology, Topology):
        raise TypeError(f"expected a taiji.Topology, got {type(topology).__name__}")
    matrix = _matrix_arg(matrix)
    nbytes = _int_in(bytes, "bytes", 0, _UINT64_MAX)
    seconds = float(_fn("taiji_predict_allreduce")(topology._c_handle(), matrix._c_handle(),
                                                    nbytes))
    if seconds < 0:
        raise InvalidArgument(_ERR_INVALID_ARGUMENT,
                              f"cannot predict: the topology has {topology.size} ranks, the "
                              f"matrix {matrix.size}")
    return seconds

