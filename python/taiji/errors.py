"""Exceptions: one TaijiError subclass per C error status.

Each class is named after its status in CamelCase. Where that word alone would shadow a
builtin or read as a noun it gets "Error" (ProtocolError, ConfigError, ...); TAIJI_ERR_IO is
``IOFailure`` because ``IOError`` is the builtin alias of OSError. ``Timeout`` also derives
from the builtin ``TimeoutError``, so ``except TimeoutError`` catches an op's timeout too.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

from . import _lib


class TaijiError(Exception):
    """A failed taiji call or op.

    ``status``: the C status (negative int); ``status_name``: "TAIJI_ERR_TIMEOUT" etc.;
    ``message``: the runtime's text (it names the ranks and fields involved), which is
    also ``str(error)``.
    """
    status: int = 0

    def __init__(self, status: int, message: str = "") -> None:
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.message = message or status_string(self.status)
        super().__init__(f"{self.status_name}: {self.message}")


class InvalidArgument(TaijiError):
    """TAIJI_ERR_INVALID_ARGUMENT."""


class NoMemory(TaijiError):
    """TAIJI_ERR_NO_MEMORY."""


class Timeout(TaijiError, TimeoutError):
    """TAIJI_ERR_TIMEOUT: the op passed its deadline; the message names who it waited for."""


class Mismatch(TaijiError):
    """TAIJI_ERR_MISMATCH: peers posted the op with different parameters."""


class PeerLost(TaijiError):
    """TAIJI_ERR_PEER_LOST."""


class Duplicate(TaijiError):
    """TAIJI_ERR_DUPLICATE: this name and version is already in flight."""


class StaleVersion(TaijiError):
    """TAIJI_ERR_STALE_VERSION."""


class ProtocolError(TaijiError):
    """TAIJI_ERR_PROTOCOL."""


class IOFailure(TaijiError):
    """TAIJI_ERR_IO."""


class ConfigError(TaijiError):
    """TAIJI_ERR_CONFIG."""


class Aborted(TaijiError):
    """TAIJI_ERR_ABORTED."""


class Finalized(TaijiError):
    """TAIJI_ERR_FINALIZED: the peer is finalized or failed."""


class VersionMismatch(TaijiError):
    """TAIJI_ERR_VERSION: binding and library versions are incompatible."""


class InternalError(TaijiError):
    """TAIJI_ERR_INTERNAL."""


class Unsupported(TaijiError):
    """TAIJI_ERR_UNSUPPORTED."""


class BootstrapError(TaijiError):
    """TAIJI_ERR_BOOTSTRAP: rendezvous or connection set-up failed."""


class AuthError(TaijiError):
    """TAIJI_ERR_AUTH: the peers' job secrets differ."""


class NotFoundError(TaijiError):
    """TAIJI_ERR_NOT_FOUND: no such name or version (never saved, or evicted)."""


class NoDeviceError(TaijiError):
    """TAIJI_ERR_NO_DEVICE: device memory, but no usable GPU or NCCL here (the message says which)."""


_BY_STATUS: Dict[int, Type[TaijiError]] = {
    -1: InvalidArgument, -2: NoMemory, -3: Timeout, -4: Mismatch, -5: PeerLost,
    -6: Duplicate, -7: StaleVersion, -8: ProtocolError, -9: IOFailure, -10: ConfigError,
    -11: Aborted, -12: Finalized, -13: VersionMismatch, -14: InternalError,
    -15: Unsupported, -16: BootstrapError, -17: AuthError,
    -18: NotFoundError, -19: NoDeviceError,
}

OK = 0
IN_PROGRESS = 1
ERR_UNSUPPORTED = -15


def error_class(status: int) -> Type[TaijiError]:
    """The exception class for a status (TaijiError itself for an unknown one)."""
    return _BY_STATUS.get(int(status), TaijiError)


def status_name(status: int) -> str:
    return _lib.text(_lib.lib().taiji_status_name(int(status)))


def status_string(status: int) -> str:
    return _lib.text(_lib.lib().taiji_status_string(int(status)))


def make_error(status: int, message: Optional[str] = None) -> TaijiError:
    return error_class(status)(status, message or "")


def check(status: int, message_fn=None) -> int:
    """Raises the matching TaijiError for a negative status; ``message_fn()`` gives the
    text (called at once, on the calling thread, where the per-thread last error lives)."""
    if status < 0:
        raise make_error(status, message_fn() if message_fn else None)
    return status
