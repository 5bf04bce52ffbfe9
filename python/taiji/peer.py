"""taiji.Peer: one process's membership in a job, and the collectives on it."""
from __future__ import annotations

import contextlib
import ctypes
import json
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

from . import _buffers, _dispatch, _lib, _log, model_store
from ._args import rank_arg as _rank_arg
from ._types import SUM, to_reduce_op
from .errors import Finalized, TaijiError, check, make_error
from .peer_elastic import ElasticMembership
from .peer_links import PeerLinks
from .request import Request

_OPTION_KEYS = ("version", "timeout_ms", "topology", "grad_stats", "callback")


class _State:
    """What closing a peer needs, apart from the Peer object (which the finalizer must
    not keep alive)."""
    __slots__ = ("handle", "closed", "lock", "children", "finalize_status", "__weakref__")

    def __init__(self, handle: ctypes.c_void_p) -> None:
        self.handle = handle
        self.closed = False
        self.lock = threading.RLock()
        self.children: List["_State"] = []
        self.finalize_status = 0


def _close_state(state: _State) -> int:
    """Finalizes then destroys the peer (children first). ctypes releases the GIL around
    both calls, so the I/O thread's last callbacks can run. Idempotent."""
    if not _dispatch.on_python_thread():
        # Collected by a garbage collection on taiji's I/O thread: destroy from ours.
        _dispatch.post(lambda: _close_state(state))
        return 0
    with state.lock:
        if state.closed:
            return state.finalize_status
        for child in list(state.children):
            _close_state(child)
        lib = _lib.lib()
        state.finalize_status = int(lib.taiji_peer_finalize(state.handle))
        lib.taiji_peer_destroy(state.handle)
        state.closed = True
        return state.finalize_status


def _encode(value: Optional[str], what: str) -> Optional[bytes]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    return value.encode("utf-8")


def _name(name: Any) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"an op's name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("an op's name must not be empty")
    return name.encode("utf-8")


def _int_or_default(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    return _rank_arg(value, what)


class Peer(ElasticMembership, PeerLinks):
    """A peer of a taiji job.

    Every argument left None comes from the environment, as ``taiji-run`` (or torchrun,
    mpirun, srun) sets it; see docs/environment.md. ``settings`` maps any variable of
    docs/environment.md to its text (``{"TAIJI_CHUNK_BYTES": "4M"}``) and wins over the
    environment. Construction blocks until every peer has joined (``init_timeout_ms``).

    Use as a context manager or call :meth:`close`; a peer never closed is closed at
    interpreter exit (or when collected), so a process never exits with the runtime's
    threads still running.

    Every collective blocks and returns its output; its ``*_async`` twin returns a
    :class:`taiji.Request`. Options (keywords): ``version`` (0: automatic),
    ``timeout_ms`` (0: the peer's default), ``topology`` (a built-in name),
    ``grad_stats`` (allreduce only: a :class:`taiji.GradStats`), ``callback``
    (async only: ``callback(request)`` on the package's callback thread).
    """

    def __init__(self, rank: Optional[int] = None, size: Optional[int] = None,
                 rendezvous: Optional[str] = None, host_rendezvous: Optional[bool] = None,
                 listen_host: Optional[str] = None, job_id: Optional[str] = None,
                 timeout_ms: Optional[int] = None, init_timeout_ms: Optional[int] = None,
                 topology: Optional[str] = None,
                 settings: Optional[Dict[str, Any]] = None) -> None:
        lib = _lib.lib()
        config = _lib.Config()
        config.rank = _int_or_default(rank, "rank", -1)
        config.size = _int_or_default(size, "size", -1)
        config.host_rendezvous = -1 if host_rendezvous is None else int(bool(host_rendezvous))
        config.timeout_ms = _int_or_default(timeout_ms, "timeout_ms", 0)
        config.init_timeout_ms = _int_or_default(init_timeout_ms, "init_timeout_ms", 0)
        strings = [_encode(rendezvous, "rendezvous"), _encode(listen_host, "listen_host"),
                   _encode(job_id, "job_id"), _encode(topology, "topology")]
        config.rendezvous, config.listen_host, config.job_id, config.topology = strings
        handle = ctypes.c_void_p()
        settings = dict(settings or {})
        if _log.chosen_level is not None:
            settings.setdefault("TAIJI_LOG_LEVEL", _log.chosen_level)
        try:
            for key, value in settings.items():
                k = _encode(key, "a settings key")
                v = None if value is None else str(value).encode("utf-8")
                check(lib.taiji_config_set(ctypes.byref(config), k, v),
                      lambda: _lib.text(lib.taiji_peer_last_error(None)))
            _dispatch.ensure_started()
            status = lib.taiji_peer_init_versioned(_lib.BINDING_HEADER_VERSION,
                                                   ctypes.byref(config), ctypes.byref(handle))
            check(status, lambda: _lib.text(lib.taiji_peer_last_error(None)))
        finally:
            lib.taiji_config_clear(ctypes.byref(config))
        self._adopt(handle, None)

    @classmethod
    def _from_handle(cls, handle: ctypes.c_void_p, parent: Optional["Peer"]) -> "Peer":
        peer = cls.__new__(cls)
        peer._adopt(handle, parent)
        return peer

    def _adopt(self, handle: ctypes.c_void_p, parent: Optional["Peer"]) -> None:
        self._state = _State(handle)
        self._parent = parent  # a child is closed before its parent: keep the parent
        if parent is not None:
            parent._state.children.append(self._state)
        self._read_membership()
        # Runs on close(), on collection, and at interpreter exit (newest first).
        self._closer = weakref.finalize(self, _close_state, self._state)

    def _read_membership(self) -> None:
        # Rank and size change only at resize() and shrink(), which call this again.
        handle = self._state.handle
        self._rank = int(_lib.lib().taiji_peer_rank(handle))
        self._size = int(_lib.lib().taiji_peer_size(handle))

    # --- lifecycle --------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This peer's rank, 0..size-1 (renumbered by resize() and shrink())."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of peers in the job (changed by resize() and shrink())."""
        return self._size

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def _handle(self) -> ctypes.c_void_p:
        if self._state.closed:
            raise Finalized(-12, "the peer is closed")
        return self._state.handle

    def finalize(self) -> None:
        """Waits (bounded by the op timeout) for ops in flight, then closes the
        connections. Idempotent. Raises the peer's sticky error, if it had one."""
        status = int(_lib.lib().taiji_peer_finalize(self._handle))
        check(status, self.last_error)

    def abort(self) -> None:
        """Fails every op in flight with Aborted and makes the peer unusable; does not
        wait for other peers. Safe from any thread and from callbacks."""
        if not self._state.closed:
            _lib.lib().taiji_peer_abort(self._state.handle)

    def close(self) -> int:
        """Finalizes (children first) and frees the peer. Idempotent; never raises for
        the peer's sticky error: returns the finalize status (0 when it was clean)."""
        if self._state.closed:
            return self._state.finalize_status
        self._closer()
        return self._state.finalize_status

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def last_error(self) -> str:
        """Text of the last failed call on this peer."""
        if self._state.closed:
            return ""
        return _lib.text(_lib.lib().taiji_peer_last_error(self._state.handle))

    def async_error(self) -> Optional[TaijiError]:
        """The error that made the peer unusable (a lost link, an abort), or None."""
        if self._state.closed:
            return None
        status = int(_lib.lib().taiji_peer_async_error(self._state.handle))
        return make_error(status, self.last_error()) if status < 0 else None

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else "open"
        return f"<taiji.Peer rank={self._rank} size={self._size} {state}>"

    # --- posting ----------------------------------------------------------------------
    def _post(self, kind: str, name: Optional[str], call: Callable[[Any, Any], int],
              keep: List[Any], result: Callable[[], Any], opts: Dict[str, Any],
              is_async: bool, grad_stats_ok: bool = False) -> Any:
        unknown = set(opts) - set(_OPTION_KEYS)
        if unknown:
            raise TypeError(f"{kind}: unknown option(s) {', '.join(sorted(unknown))}")
        options = _lib.OpOptions()
        options.memory, options.stream = _buffers.memory_of(keep)
        version = opts.get("version", 0) or 0
        timeout_ms = opts.get("timeout_ms", 0) or 0
        options.version = _rank_arg(version, "version")
        options.timeout_ms = _rank_arg(timeout_ms, "timeout_ms")
        if version < 0:
            raise ValueError("version must be >= 0")
        topology = opts.get("topology")
        if topology is not None:
            topology = topology if isinstance(topology, str) else getattr(topology, "text")
            options.topology = topology.encode("utf-8")
        stats = opts.get("grad_stats")
        if stats is not None:
            if not grad_stats_ok:
                raise TypeError(f"{kind}: grad_stats is an allreduce option")
            options.grad_stats = stats._c_handle()
            keep.append(stats)
        callback = opts.get("callback")
        if callback is not None and not is_async:
            raise TypeError(f"{kind}: callback is an option of {kind}_async")
        handle = self._handle
        if not is_async:
            check(call(handle, ctypes.byref(options), None), self.last_error)
            return result()
        request = Request(self, kind, name, keep, result)
        if callback is not None:
            request.add_done_callback(callback)
        request._arm(options)
        status = call(handle, ctypes.byref(options), ctypes.byref(request._handle))
        if status < 0:
            request._disarm()
            raise make_error(status, self.last_error())
        return request

    # --- collectives ------------------------------------------------------------------
    def allreduce(self, x: Any, name: str, op: int = SUM, out: Any = None, **opts: Any) -> Any:
        """out[i] = op over peers of x[i]; ``out=None`` allocates, ``out=x`` is in place."""
        return self._allreduce(x, name, op, out, opts, False)

    def allreduce_async(self, x: Any, name: str, op: int = SUM, out: Any = None,
                        **opts: Any) -> Request:
        return self._allreduce(x, name, op, out, opts, True)

    def _allreduce(self, x, name, op, out, opts, is_async):
        n = _name(name)
        rop = to_reduce_op(op)
        xb = _buffers.as_input(x, "x")
        ob = _buffers.output(xb, out, xb.count, _buffers.shape_of(xb))
        lib = _lib.lib()
        return self._post("allreduce", name, lambda h, o, r: lib.taiji_allreduce(
            h, n, xb.ptr, ob.ptr, xb.count, xb.dtype, rop, o, r),
            [xb, ob], lambda: ob.obj, opts, is_async, grad_stats_ok=True)

    def broadcast(self, x: Any, name: str, root: int, **opts: Any) -> Any:
        """Copies root's x into every peer's x (in place); returns x."""
        return self._broadcast(x, name, root, opts, False)

    def broadcast_async(self, x: Any, name: str, root: int, **opts: Any) -> Request:
        return self._broadcast(x, name, root, opts, True)

    def _broadcast(self, x, name, root, opts, is_async):
        n = _name(name)
        root = _rank_arg(root, "root")
        xb = _buffers.as_output(x, "x")
        lib = _lib.lib()
        return self._post("broadcast", name, lambda h, o, r: lib.taiji_broadcast(
            h, n, xb.ptr, xb.count, xb.dtype, root, o, r), [xb], lambda: xb.obj, opts,
            is_async)

    def barrier(self, name: str = "barrier", **opts: Any) -> None:
        """Returns once every peer has posted it."""
        return self._barrier(name, opts, False)

    def barrier_async(self, name: str = "barrier", **opts: Any) -> Request:
        return self._barrier(name, opts, True)

    def _barrier(self, name, opts, is_async):
        n = _name(name)
        lib = _lib.lib()
        return self._post("barrier", name, lambda h, o, r: lib.taiji_barrier(h, n, o, r),
                          [], lambda: None, opts, is_async)

    def allgather(self, x: Any, name: str, out: Any = None, **opts: Any) -> Any:
        """Every rank's x in rank order: ``size * x.size`` elements, allocated with shape
        ``(size, *x.shape)``."""
        return self._allgather(x, name, out, opts, False)

    def allgather_async(self, x: Any, name: str, out: Any = None, **opts: Any) -> Request:
        return self._allgather(x, name, out, opts, True)

    def _allgather(self, x, name, out, opts, is_async):
        n = _name(name)
        xb = _buffers.as_input(x, "x")
        ob = _buffers.output(xb, out, self._size * xb.count,
                             (self._size,) + _buffers.shape_of(xb))
        lib = _lib.lib()
        return self._post("allgather", name, lambda h, o, r: lib.taiji_allgather(
            h, n, xb.ptr, ob.ptr, xb.count, xb.dtype, o, r), [xb, ob], lambda: ob.obj,
            opts, is_async)

    def reduce(self, x: Any, name: str, root: int, op: int = SUM, out: Any = None,
               **opts: Any) -> Any:
        """op over peers of x into root's output (allocated like x on the root when out
        is None). Returns the output on the root, ``out`` (untouched, maybe None) on other
        ranks."""
        return self._reduce(x, name, root, op, out, opts, False)

    def reduce_async(self, x: Any, name: str, root: int, op: int = SUM, out: Any = None,
                     **opts: Any) -> Request:
        return self._reduce(x, name, root, op, out, opts, True)

    def _reduce(self, x, name, root, op, out, opts, is_async):
        n = _name(name)
        root = _rank_arg(root, "root")
        rop = to_reduce_op(op)
        xb = _buffers.as_input(x, "x")
        ob = self._root_output(xb, out, root, xb.count, _buffers.shape_of(xb))
        lib = _lib.lib()
        ptr = ob.ptr if ob is not None else None
        return self._post("reduce", name, lambda h, o, r: lib.taiji_reduce(
            h, n, xb.ptr, ptr, xb.count, xb.dtype, rop, root, o, r), [xb, ob],
            lambda: ob.obj if ob is not None else None, opts, is_async)

    def gather(self, x: Any, name: str, root: int, out: Any = None, **opts: Any) -> Any:
        """Every rank's x in rank order on the root (``(size, *x.shape)`` when
        allocated); other ranks get ``out`` back (untouched, maybe None)."""
        return self._gather(x, name, root, out, opts, False)

    def gather_async(self, x: Any, name: str, root: int, out: Any = None,
                     **opts: Any) -> Request:
        return self._gather(x, name, root, out, opts, True)

    def _gather(self, x, name, root, out, opts, is_async):
        n = _name(name)
        root = _rank_arg(root, "root")
        xb = _buffers.as_input(x, "x")
        ob = self._root_output(xb, out, root, self._size * xb.count,
                               (self._size,) + _buffers.shape_of(xb))
        lib = _lib.lib()
        ptr = ob.ptr if ob is not None else None
        return self._post("gather", name, lambda h, o, r: lib.taiji_gather(
            h, n, xb.ptr, ptr, xb.count, xb.dtype, root, o, r), [xb, ob],
            lambda: ob.obj if ob is not None else None, opts, is_async)

    def _root_output(self, xb, out, root, count, shape):
        if root == self._rank:
            return _buffers.output(xb, out, count, shape)
        return _buffers.output(xb, out, count, shape) if out is not None else None

    def reduce_scatter(self, x: Any, name: str, op: int = SUM, out: Any = None,
                       **opts: Any) -> Any:
        """x holds ``size`` blocks; rank r gets op over peers of block r (shape
        ``x.shape[1:]`` when ``x.shape[0] == size``, else flat)."""
        return self._reduce_scatter(x, name, op, out, opts, False)

    def reduce_scatter_async(self, x: Any, name: str, op: int = SUM, out: Any = None,
                             **opts: Any) -> Request:
        return self._reduce_scatter(x, name, op, out, opts, True)

    def _reduce_scatter(self, x, name, op, out, opts, is_async):
        n = _name(name)
        rop = to_reduce_op(op)
        xb = _buffers.as_input(x, "x")
        if xb.count % self._size:
            raise ValueError(f"reduce_scatter: x has {xb.count} elements, not a multiple "
                             f"of the world size {self._size}")
        recv = xb.count // self._size
        shape = _buffers.shape_of(xb)
        shape = shape[1:] if shape and shape[0] == self._size else (recv,)
        ob = _buffers.output(xb, out, recv, shape)
        lib = _lib.lib()
        return self._post("reduce_scatter", name, lambda h, o, r: lib.taiji_reduce_scatter(
            h, n, xb.ptr, ob.ptr, recv, xb.dtype, rop, o, r), [xb, ob], lambda: ob.obj,
            opts, is_async)

    def consensus(self, x: Any, name: str, **opts: Any) -> bool:
        """True when every peer holds the same bytes in x."""
        return self._consensus(x, name, opts, False)

    def consensus_async(self, x: Any, name: str, **opts: Any) -> Request:
        return self._consensus(x, name, opts, True)

    def _consensus(self, x, name, opts, is_async):
        n = _name(name)
        xb = _buffers.as_input(x, "x")
        agree = ctypes.c_int(0)
        lib = _lib.lib()
        return self._post("consensus", name, lambda h, o, r: lib.taiji_consensus(
            h, n, xb.ptr, xb.nbytes, ctypes.byref(agree), o, r), [xb, agree],
            lambda: bool(agree.value), opts, is_async)

    def send(self, x: Any, name: str, dst: int, **opts: Any) -> None:
        """Sends x to rank dst, matched by the recv there with this name and version."""
        return self._send(x, name, dst, opts, False)

    def send_async(self, x: Any, name: str, dst: int, **opts: Any) -> Request:
        return self._send(x, name, dst, opts, True)

    def _send(self, x, name, dst, opts, is_async):
        n = _name(name)
        dst = _rank_arg(dst, "dst")
        xb = _buffers.as_input(x, "x")
        lib = _lib.lib()
        return self._post("send", name, lambda h, o, r: lib.taiji_send(
            h, n, xb.ptr, xb.count, xb.dtype, dst, o, r), [xb], lambda: None, opts, is_async)

    def recv(self, x: Any, name: str, src: int, **opts: Any) -> Any:
        """Receives rank src's send of this name into x; returns x."""
        return self._recv(x, name, src, opts, False)

    def recv_async(self, x: Any, name: str, src: int, **opts: Any) -> Request:
        return self._recv(x, name, src, opts, True)

    def _recv(self, x, name, src, opts, is_async):
        n = _name(name)
        src = _rank_arg(src, "src")
        xb = _buffers.as_output(x, "x")
        lib = _lib.lib()
        return self._post("recv", name, lambda h, o, r: lib.taiji_recv(
            h, n, xb.ptr, xb.count, xb.dtype, src, o, r), [xb], lambda: xb.obj, opts,
            is_async)

    def set_topology(self, topology: Any = None, **opts: Any) -> None:
        """Swaps the topology for ops posted after this call (a collective: every peer
        calls it at the same point). ``topology``: a :class:`taiji.Topology`, a built-in
        name or text form, or None (back to the automatic choice)."""
        return self._set_topology(topology, opts, False)

    def set_topology_async(self, topology: Any = None, **opts: Any) -> Request:
        return self._set_topology(topology, opts, True)

    def _set_topology(self, topology, opts, is_async):
        from .topology import Topology
        if isinstance(topology, str):
            topology = Topology.from_text(topology, peer=self)
        elif topology is not None and not isinstance(topology, Topology):
            raise TypeError("set_topology takes a taiji.Topology, a str or None")
        ptr = topology._c_handle() if topology is not None else None
        lib = _lib.lib()
        return self._post("set_topology", None, lambda h, o, r: lib.taiji_set_topology(
            h, ptr, o, r), [topology], lambda: None, opts, is_async)

    def step_mark(self, **opts: Any) -> None:
        """Marks the end of a training step (a collective; see docs/monitoring.md)."""
        return self._step_mark(opts, False)

    def step_mark_async(self, **opts: Any) -> Request:
        return self._step_mark(opts, True)

    def _step_mark(self, opts, is_async):
        lib = _lib.lib()
        return self._post("step_mark", None, lambda h, o, r: lib.taiji_step_mark(h, o, r),
                          [], lambda: None, opts, is_async)

    # --- groups, sub-groups -----------------------------------------------------------
    @contextlib.contextmanager
    def group(self) -> Iterator["Peer"]:
        """Holds the ops this thread posts inside the block and hands them over together
        at its end (post ``*_async`` ops inside; a blocking call there is
        InvalidArgument). Nests."""
        lib = _lib.lib()
        check(lib.taiji_group_start(self._handle), self.last_error)
        try:
            yield self
        finally:
            check(lib.taiji_group_end(self._handle), self.last_error)

    def split(self, color: int, key: Optional[int] = None,
              timeout_ms: int = 0) -> Optional["Peer"]:
        """A collective over this peer: ranks passing the same color >= 0 form a child
        Peer, ranked by (key, parent rank); key None is this rank. A negative color takes
        part and gets None. The child is closed before this peer."""
        color = _rank_arg(color, "color")
        key = self._rank if key is None else _rank_arg(key, "key")
        options = _lib.OpOptions()
        options.timeout_ms = _rank_arg(timeout_ms, "timeout_ms")
        child = ctypes.c_void_p()
        check(_lib.lib().taiji_peer_split(self._handle, color, key, ctypes.byref(options),
                                          ctypes.byref(child)), self.last_error)
        if not child.value:
            return None
        return Peer._from_handle(child, self)

    # --- model store (python/taiji/model_store.py) --------------------------------------
    def model_save(self, name: str, x: Any, version: int = 0) -> int:
        """Copies x into this peer's store under name; returns the version saved (0: the
        latest + 1). Never waits on the network."""
        return model_store.save(self, name, x, version)

    def model_request(self, rank: int, name: str, out: Any, version: int = 0,
                      **opts: Any) -> Any:
        """Fetches rank's saved model (version 0: the latest) into out, which must hold
        exactly its bytes; returns out. The owner's I/O thread serves it. Options:
        timeout_ms."""
        return model_store.request(self, rank, name, out, version, opts, False)

    def model_request_async(self, rank: int, name: str, out: Any, version: int = 0,
                            **opts: Any) -> Request:
        """model_request, returning a Request (options: timeout_ms, callback)."""
        return model_store.request(self, rank, name, out, version, opts, True)

    # --- monitoring -------------------------------------------------------------------
    def _json(self, fn: Any) -> Dict[str, Any]:
        needed = ctypes.c_size_t(0)
        fn(self._handle, None, 0, ctypes.byref(needed))
        while True:
            size = needed.value + 4096  # the snapshot may grow between the two calls
            buf = ctypes.create_string_buffer(size)
            status = fn(self._handle, buf, size, ctypes.byref(needed))
            if status == 0:
                return json.loads(buf.value.decode("utf-8"))
            if needed.value <= size:
                check(status, self.last_error)

    def metrics(self) -> Dict[str, Any]:
        """The metrics snapshot (docs/monitoring.md, include/taiji/metrics.h) as a dict."""
        return self._json(_lib.lib().taiji_metrics_json)

    def flight_recorder(self) -> Dict[str, Any]:
        """The flight recorder's recent ops as a dict."""
        return self._json(_lib.lib().taiji_flight_recorder_json)

    def set_metrics_enabled(self, enabled: bool) -> None:
        check(_lib.lib().taiji_metrics_set_enabled(self._handle, int(bool(enabled))),
              self.last_error)

    def probe_rtt(self, timeout_ms: int = 1000) -> None:
        """Measures each link's round-trip time (then in ``metrics()["links"]``)."""
        check(_lib.lib().taiji_metrics_probe_rtt(self._handle, timeout_ms), self.last_error)

    def grad_stats(self, batch_size: float, smoothing: float = 0.0,
                   element_variance: bool = False, tensors_per_step: int = 0) -> "Any":
        """A :class:`taiji.GradStats` for this peer (see docs/gradient-statistics.md)."""
        from .grad_stats import GradStats
        return GradStats(self, batch_size, smoothing, element_variance, tensors_per_step)
