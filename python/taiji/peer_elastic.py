"""Elastic membership on taiji.Peer: resize, shrink and the cluster versions
(include/taiji/taiji.h, "elastic membership"; docs/elastic.md)."""
from __future__ import annotations

import ctypes
from typing import Any, Tuple

from . import _lib
from ._args import rank_arg as _rank_arg
from .errors import Unsupported, check


class ElasticMembership:
    """Mixed into taiji.Peer, whose _handle, last_error and _read_membership it uses."""

    def _elastic(self, name: str) -> Any:
        try:
            return _lib.late(name)
        except AttributeError:
            from . import version
            raise Unsupported(-15, f"the loaded libtaiji {version()} has no {name}: elastic "
                                   "membership needs a newer library") from None

    def resize(self, new_size: int, timeout_ms: int = 0) -> Tuple[bool, bool]:
        """Resizes the job in place to ``new_size`` peers: a collective over the current
        members, each passing the same size (else :class:`taiji.Mismatch` on every one and
        nothing changes). Returns ``(changed, detached)``.

        Growing waits (``timeout_ms``; 0: the peer's init timeout) for the processes that
        ``taiji-run --elastic`` starts as ranks size..new_size-1. Shrinking detaches ranks
        >= new_size: they get ``detached`` True and must :meth:`close` the peer. Members keep
        their rank; :attr:`rank`, :attr:`size` and :attr:`cluster_version` are the new ones
        on return. Right after a change every member, joiners included, posts the same
        broadcasts from rank 0 (the state a joiner lacks). Blocks; not inside
        :meth:`group` nor from a callback. Raises Mismatch, Timeout (a member did not
        call it), PeerLost, BootstrapError, Finalized, InvalidArgument, and Unsupported
        when the library predates elastic membership."""
        new_size = _rank_arg(new_size, "new_size")
        fn = self._elastic("taiji_resize")
        options = _lib.OpOptions()
        options.timeout_ms = _rank_arg(timeout_ms, "timeout_ms")
        changed, detached = ctypes.c_int(0), ctypes.c_int(0)
        handle = self._handle
        try:
            check(fn(handle, new_size, ctypes.byref(options), ctypes.byref(changed),
                     ctypes.byref(detached)), self.last_error)
        finally:
            self._read_membership()
        return bool(changed.value), bool(detached.value)

    def shrink(self, timeout_ms: int = 0) -> bool:
        """Continues without the lost ranks after :class:`taiji.PeerLost`: a collective
        over the survivors, renumbered densely in their old order; the peer's sticky error
        is cleared and it takes ops again. Returns whether a rank was lost (False: nothing
        changed). Ops in flight from before fail with Aborted. Needs a store that outlives
        the lost ranks (taiji-run's or etcd). Bounded by ``timeout_ms`` (0: the peer's init
        timeout); on Timeout or BootstrapError (a rank lost during it) it may be called
        again. Blocks; not inside :meth:`group` nor from a callback."""
        fn = self._elastic("taiji_shrink")
        options = _lib.OpOptions()
        options.timeout_ms = _rank_arg(timeout_ms, "timeout_ms")
        changed = ctypes.c_int(0)
        handle = self._handle
        try:
            check(fn(handle, ctypes.byref(options), ctypes.byref(changed)),
                  self.last_error)
        finally:
            self._read_membership()
        return bool(changed.value)

    @property
    def cluster_version(self) -> int:
        """The membership's version: 1 for the first members, +1 at every resize or
        shrink that changed it. The same on every member."""
        return int(self._elastic("taiji_peer_cluster_version")(self._handle))

    @property
    def joined_version(self) -> int:
        """The cluster version at which this process joined: 1 for the first members,
        larger for a process a resize started (it must receive the model's state)."""
        return int(self._elastic("taiji_peer_joined_version")(self._handle))

    def requested_size(self) -> int:
        """The size asked for from outside (``taiji-run --resize N``, or N written to the
        store key ``<job id>/elastic/request``) that no resize has applied yet; 0 when
        none is pending or the store does not answer. Ranks may read it at different
        moments: agree on one value (a broadcast from rank 0) before resizing. Blocks for
        one store round trip (at most about a second)."""
        return int(self._elastic("taiji_peer_requested_size")(self._handle))

