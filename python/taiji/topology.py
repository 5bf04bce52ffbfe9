"""taiji.Topology: the (reduce graph, broadcast graph) pairs ops run on."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Optional, Sequence

from . import _lib
from .errors import check


def _last_init_error() -> str:
    return _lib.text(_lib.lib().taiji_peer_last_error(None))


def _ints(rows: Sequence[Sequence[int]], width: int, what: str) -> "ctypes.Array":
    flat = []
    for row in rows:
        row = list(row)
        if len(row) != width:
            raise ValueError(f"{what}: each pair needs {width} entries, got {len(row)}")
        for v in row:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{what}: entries must be ints")
        flat.extend(row)
    return (ctypes.c_int * max(1, len(flat)))(*flat)


class Topology:
    """An immutable topology. Build it with one of the class methods; give it to
    :meth:`taiji.Peer.set_topology`."""

    def __init__(self, handle: ctypes.c_void_p) -> None:
        self._handle = handle
        self._closer = weakref.finalize(self, _lib.lib().taiji_topology_destroy, handle)

    def _c_handle(self) -> ctypes.c_void_p:
        return self._handle

    @classmethod
    def from_name(cls, name: str, size: int = 0, peer: Any = None) -> "Topology":
        """A built-in shape: star, ring, clique, tree, binary_tree, binary_tree_star,
        multi_binary_tree_star, hierarchical. With a peer, for its job (size may be 0)."""
        return cls.from_text(name, peer=peer, size=size)

    @classmethod
    def from_text(cls, text: str, peer: Any = None, size: int = 0) -> "Topology":
        """A built-in name or the text form :attr:`text` writes."""
        if not isinstance(text, str):
            raise TypeError("topology text must be a str")
        handle = ctypes.c_void_p()
        peer_handle = peer._handle if peer is not None else None
        check(_lib.lib().taiji_topology_from_text(peer_handle, text.encode("utf-8"), size,
                                                  ctypes.byref(handle)), _last_init_error)
        return cls(handle)

    @classmethod
    def from_parents(cls, size: int, reduce_parents: Sequence[Sequence[int]],
                     broadcast_parents: Sequence[Sequence[int]]) -> "Topology":
        """One list per pair: ``reduce_parents[p][r]`` is rank r's parent in pair p's
        reduce graph (-1 for its root); broadcast_parents likewise."""
        pairs = len(reduce_parents)
        if pairs != len(broadcast_parents):
            raise ValueError("reduce_parents and broadcast_parents need as many pairs")
        red = _ints(reduce_parents, size, "reduce_parents")
        bc = _ints(broadcast_parents, size, "broadcast_parents")
        handle = ctypes.c_void_p()
        check(_lib.lib().taiji_topology_from_parents(size, pairs, red, bc,
                                                     ctypes.byref(handle)), _last_init_error)
        return cls(handle)

    @classmethod
    def from_edges(cls, size: int, reduce_edges: Sequence[Sequence[Sequence[int]]],
                   broadcast_edges: Sequence[Sequence[Sequence[int]]]) -> "Topology":
        """One list of (child, parent) edges per pair (size - 1 edges per graph)."""
        pairs = len(reduce_edges)
        if pairs != len(broadcast_edges):
            raise ValueError("reduce_edges and broadcast_edges need as many pairs")
        flat = lambda graphs: [[v for edge in g for v in edge] for g in graphs]  # noqa: E731
        red = _ints(flat(reduce_edges), 2 * (size - 1), "reduce_edges")
        bc = _ints(flat(broadcast_edges), 2 * (size - 1), "broadcast_edges")
        handle = ctypes.c_void_p()
        check(_lib.lib().taiji_topology_from_edges(size, pairs, red, bc,
                                                   ctypes.byref(handle)), _last_init_error)
        return cls(handle)

    @property
    def text(self) -> str:
        lib = _lib.lib()
        n = lib.taiji_topology_text(self._handle, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.taiji_topology_text(self._handle, buf, n + 1)
        return buf.value.decode("utf-8")

    @property
    def digest(self) -> int:
        return int(_lib.lib().taiji_topology_digest(self._handle))

    @property
    def size(self) -> int:
        return int(_lib.lib().taiji_topology_size(self._handle))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Topology) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"<taiji.Topology size={self.size} digest={self.digest:#x}>"
