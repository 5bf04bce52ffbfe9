"""Routing the C library's log into Python's logging (logger "taiji"), on request.

The C log callback runs on whichever thread logs, taiji's I/O threads included: it only
queues the line; the package's callback thread hands it to logging.
"""
from __future__ import annotations

import atexit
import logging
from typing import Optional

from . import _dispatch, _lib
from .errors import check

logger = logging.getLogger("taiji")

_TO_PYTHON = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING,
              4: logging.ERROR, 5: logging.CRITICAL}
_routed = False
_C_LEVEL_NAMES = ("trace", "debug", "info", "warn", "error", "critical")
# The level log_to_python chose, as TAIJI_LOG_LEVEL text: a peer's init sets the process's
# log level from its own configuration, so each new peer is given this one.
chosen_level: Optional[str] = None


def _c_level(level: int) -> int:
    """The taiji level that lets through what ``level`` (a logging level) shows."""
    if level <= 5:
        return 0
    if level <= logging.DEBUG:
        return 1
    if level <= logging.INFO:
        return 2
    if level <= logging.WARNING:
        return 3
    if level <= logging.ERROR:
        return 4
    return 5


def _emit(level: int, message: str) -> None:
    logger.log(_TO_PYTHON.get(level, logging.INFO), message)


def _on_log(level: int, message: Optional[bytes], user_data: object) -> None:
    text = message.decode("utf-8", "replace") if message else ""
    _dispatch._queue.put(lambda: _emit(level, text))


_C_LOG = _lib.LOG_CALLBACK(_on_log)


def log_to_python(level: int = logging.INFO) -> None:
    """Sends the process's taiji log (every peer's) to the logger "taiji" from now on;
    lines below ``level`` (a logging level) are dropped in C before formatting."""
    global _routed, chosen_level
    _dispatch.ensure_started()
    check(_lib.lib().taiji_set_log_callback(_C_LOG, _c_level(level), None))
    chosen_level = _C_LEVEL_NAMES[_c_level(level)]
    if not _routed:
        _routed = True
        # Back to stderr before the interpreter goes: a foreign thread must not enter a
        # Python callback after finalization.
        atexit.register(log_to_stderr)


def log_to_stderr(level: Optional[int] = None) -> None:
    """Back to taiji's own stderr log (the default; level None: warnings and above)."""
    global chosen_level
    chosen_level = None
    _lib.lib().taiji_set_log_callback(_lib.LOG_CALLBACK(), _c_level(level or logging.WARNING),
                                      None)
