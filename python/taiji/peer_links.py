"""Link measurement on taiji.Peer: measure_links and links (include/taiji/links.h;
docs/topologies.md)."""
from __future__ import annotations

import ctypes
from typing import Optional

from . import _lib
from .errors import check
from .links import _INT64_MAX, _INT_MAX, _INT_MIN, _UINT64_MAX, LinkMatrix, _fn, _int_in


class PeerLinks:
    """Mixed into taiji.Peer, whose _handle and last_error it uses."""

    def measure_links(self, probe_bytes: int = 0, latency_rounds: int = 0,
                      bandwidth_rounds: int = 0, timeout_ms: int = 0,
                      background: bool = False) -> LinkMatrix:
        """Measures every link of the job and returns the matrix, the same on every rank
        (a collective: every rank calls it at the same point of its op stream; blocks).
        ``probe_bytes``: each bandwidth probe's message, 1 B to 1 GiB (0: 4 MiB);
        ``latency_rounds`` / ``bandwidth_rounds``: small round trips and large messages
        per direction, 1-100 (0: 5 and 2; the fastest counts); ``timeout_ms``: the whole
        measurement (0: the peer's op timeout). ``background``: send no probes now, only
        gather the rows the peer's background probes measured (``TAIJI_LINK_PROBE_RATE``;
        0 where a link has no sample yet). The peer keeps the matrix
        (:meth:`links`) and puts this rank's row into its metrics. Raises
        InvalidArgument (an option out of range, a call from a callback), else the
        failed probe's error (Timeout, PeerLost, ...) naming the pair."""
        options = _lib.MeasureOptions()
        options.probe_bytes = _int_in(probe_bytes, "probe_bytes", 0, _UINT64_MAX)
        options.latency_rounds = _int_in(latency_rounds, "latency_rounds", _INT_MIN, _INT_MAX)
        options.bandwidth_rounds = _int_in(bandwidth_rounds, "bandwidth_rounds", _INT_MIN,
                                           _INT_MAX)
        options.timeout_ms = _int_in(timeout_ms, "timeout_ms", -_INT64_MAX - 1, _INT64_MAX)
        options.background = 1 if background else 0
        fn = _fn("taiji_measure_links")
        handle = self._handle
        matrix = ctypes.c_void_p()
        check(fn(handle, ctypes.byref(options), ctypes.byref(matrix)), self.last_error)
        return LinkMatrix(matrix)

    def links(self) -> Optional[LinkMatrix]:
        """The latest matrix this peer measured (a copy), or None before the first
        :meth:`measure_links`. Never blocks."""
        fn = _fn("taiji_peer_links")
        matrix = ctypes.c_void_p()
        check(fn(self._handle, ctypes.byref(matrix)), self.last_error)
        return LinkMatrix(matrix) if matrix.value else None
