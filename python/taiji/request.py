"""taiji.Request: one posted asynchronous op."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, List, Optional

from . import _dispatch, _lib
from .errors import IN_PROGRESS, OK, make_error


class Request:
    """An op in flight. Made by the ``*_async`` methods of :class:`taiji.Peer`.

    ``wait(timeout)`` returns the op's output and raises the op's TaijiError on failure;
    ``test()`` says whether it completed. Callbacks added with ``add_done_callback`` run
    once, on the package's callback thread, after the op completed (also when it failed).
    The Request keeps the op's arrays referenced until the C runtime is done with them.
    """

    def __init__(self, peer: Any, kind: str, name: Optional[str], keep: List[Any],
                 result: Callable[[], Any]) -> None:
        self._peer = peer
        self.kind = kind
        self.name = name
        self._keep = keep          # buffers, option strings, the grad-stats object
        self._result = result
        self._handle = ctypes.c_void_p()
        self._id = _dispatch.next_id()
        self._lock = threading.Lock()
        self._callbacks: List[Callable[["Request"], Any]] = []
        self._fired = False        # the C callback ran and the Python callbacks were run
        self._c_status: Optional[int] = None

    # --- used by Peer while posting ---------------------------------------------------
    def _arm(self, options: "_lib.OpOptions") -> None:
        options.callback = _dispatch.C_CALLBACK
        options.user_data = self._id
        _dispatch.ensure_started()
        _dispatch.register(self._id, self)  # before the post: the callback may fire first

    def _disarm(self) -> None:
        _dispatch.unregister(self._id)  # the post failed: C never calls back

    def _c_completed_quietly(self, status: int) -> bool:
        """On taiji's I/O thread: records the completion if no callback waits for it."""
        with self._lock:
            if self._callbacks:
                return False
            self._c_status = status
            self._fired = True
            return True

    def _c_completed(self, status: int) -> None:
        with self._lock:
            self._c_status = status
            self._fired = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._run_callback(fn)

    def _run_callback(self, fn: Callable[["Request"], Any]) -> None:
        try:
            fn(self)
        except Exception:
            _dispatch._log.exception("taiji: exception in a request callback")

    # --- public -----------------------------------------------------------------------
    def add_done_callback(self, fn: Callable[["Request"], Any]) -> None:
        """Runs ``fn(request)`` on the package's callback thread once the op completed
        (at once, there, if it already has)."""
        with self._lock:
            if not self._fired:
                self._callbacks.append(fn)
                return
        _dispatch.post(lambda: self._run_callback(fn))

    def test(self) -> bool:
        """True once the op has completed (successfully or not). Never blocks."""
        return self.status != IN_PROGRESS

    @property
    def done(self) -> bool:
        return self.test()

    @property
    def status(self) -> int:
        """IN_PROGRESS (1) while running, else the op's final status (0 or an error)."""
        return int(_lib.lib().taiji_request_test(self._handle))

    @property
    def version(self) -> int:
        """The op's version (the automatic counter's value when it was 0)."""
        return int(_lib.lib().taiji_request_version(self._handle))

    @property
    def error(self) -> str:
        """The op's error text once it failed; "" otherwise."""
        return _lib.text(_lib.lib().taiji_request_error(self._handle))

    @property
    def topology_digest(self) -> int:
        return int(_lib.lib().taiji_request_topology_digest(self._handle))

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits for the op and returns its output (the output array, a bool for
        consensus, None for barrier and the like). ``timeout`` in seconds, None: until the
        op completes (its own deadline bounds that). Raises the op's TaijiError subclass
        if it failed, and the builtin TimeoutError if ``timeout`` passed first (the op
        goes on; wait again)."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        status = int(_lib.lib().taiji_request_wait(self._handle, ms))
        if status == IN_PROGRESS:
            raise TimeoutError(f"taiji request {self.kind} {self.name!r} still in progress "
                               f"after {timeout} s")
        if status != OK:
            message = self.error
            if not message:  # a wait refused at once (inside a group) has no op error
                message = self._peer.last_error()
            raise make_error(status, message)
        return self._result()

    def __repr__(self) -> str:
        return f"<taiji.Request {self.kind} {self.name!r} status={self.status}>"

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is None or not handle.value:
            return
        self._handle = None
        try:
            if _lib._lib is None:
                return
            if _dispatch.on_python_thread():
                _lib._lib.taiji_request_free(handle)
            else:  # collected on taiji's I/O thread: free it from ours instead
                _dispatch.post(lambda: _lib._lib.taiji_request_free(handle))
        except (AttributeError, TypeError):
            pass  # the interpreter is exiting: module globals are gone, and so is the peer
