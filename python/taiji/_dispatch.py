"""The package's one callback thread.

Completion callbacks from C run on taiji's I/O thread, holding the GIL while they run:
there the C callback only puts the request id on a queue. One daemon thread (started
lazily) takes ids off the queue and runs the Python callbacks, and also runs work that
must not happen on a foreign thread (a peer collected by the garbage collector there is
closed here instead).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Any, Callable, Dict

from . import _lib

_log = logging.getLogger("taiji")

_queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
_thread_lock = threading.Lock()
_thread: "threading.Thread | None" = None

# Requests C still refers to (by id, through user_data), kept alive until their C
# callback has fired: the Request holds the buffers the runtime is using.
_pending: Dict[int, Any] = {}
_ids = itertools.count(1)


def next_id() -> int:
    return next(_ids)


def register(request_id: int, request: Any) -> None:
    _pending[request_id] = request


def unregister(request_id: int) -> None:
    _pending.pop(request_id, None)


def pending_count() -> int:
    return len(_pending)


def _on_complete(status: int, user_data: Any) -> None:
    # Runs on taiji's I/O thread: nothing that blocks, no user code. A request without
    # Python callbacks is marked done here; waking the callback thread for it would cost
    # a GIL hand-over per op (an async op waited on took 5x a blocking one).
    request = _pending.get(user_data)
    if request is not None and request._c_completed_quietly(status):
        _pending.pop(user_data, None)  # its memory, if this was the last reference, is
        return                         # freed from the callback thread (Request.__del__)
    _queue.put((user_data, status))  # SimpleQueue.put never blocks


C_CALLBACK = _lib.CALLBACK(_on_complete)  # kept referenced for the life of the process


def post(fn: Callable[[], None]) -> None:
    """Runs ``fn()`` on the callback thread."""
    ensure_started()
    _queue.put(fn)


def on_callback_thread() -> bool:
    return _thread is not None and threading.get_ident() == _thread.ident


def on_python_thread() -> bool:
    """False on a foreign (C) thread, where a garbage collection may have started us."""
    return threading.get_ident() in threading._active  # type: ignore[attr-defined]


def ensure_started() -> None:
    global _thread
    if _thread is not None:
        return
    with _thread_lock:
        if _thread is None:
            t = threading.Thread(target=_run, name="taiji-callbacks", daemon=True)
            t.start()
            _thread = t


def _run() -> None:
    while True:
        item = _queue.get()
        try:
            if callable(item):
                item()
            else:
                request_id, status = item
                request = _pending.pop(request_id, None)
                if request is not None:
                    request._c_completed(status)
        except Exception:  # a user callback's error must not stop the thread
            _log.exception("taiji: exception in a callback")
        del item
