"""taiji.RendezvousServer: the store peers meet at, served from this process."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any

from . import _lib
from .errors import check


class RendezvousServer:
    """Serves the rendezvous store on ``host_port`` (port 0: the system picks one and
    :attr:`address` reports it; the socket stays bound, so there is no race). Give
    ``address`` to every peer as ``rendezvous=`` with ``host_rendezvous=False``; keep the
    server running until they are all closed."""

    def __init__(self, host_port: str = "127.0.0.1:0") -> None:
        if not isinstance(host_port, str):
            raise TypeError("host_port must be a str 'host:port'")
        lib = _lib.lib()
        handle = ctypes.c_void_p()
        check(lib.taiji_rendezvous_start(host_port.encode("utf-8"), ctypes.byref(handle)),
              lambda: _lib.text(lib.taiji_peer_last_error(None)))
        n = lib.taiji_rendezvous_address(handle, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.taiji_rendezvous_address(handle, buf, n + 1)
        self.address: str = buf.value.decode("utf-8")
        self._closer = weakref.finalize(self, lib.taiji_rendezvous_stop, handle)

    def stop(self) -> None:
        """Stops serving. Idempotent."""
        self._closer()

    def __enter__(self) -> "RendezvousServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<taiji.RendezvousServer {self.address}>"
