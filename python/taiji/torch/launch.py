"""``init_process_group`` under ``taiji-run``: torch's ``env://`` rendezvous without
MASTER_ADDR and MASTER_PORT.

taiji-run gives each rank TAIJI_RANK, TAIJI_WORLD_SIZE and its own rendezvous, not the
variables torch's ``env://`` reads. When those are missing and TAIJI_RENDEZVOUS is set,
the wrapped handler joins the taiji job from the environment, lets rank 0 start a
TCPStore on a port the system chooses, broadcasts that port over taiji (no guessed port,
no race), and hands the taiji peer to the world group, so the job bootstraps once.
torchrun and anything else that sets MASTER_ADDR/MASTER_PORT go to torch's handler as
before.
"""
from __future__ import annotations

import datetime
import os
from typing import Any, Iterator, Tuple

import numpy as np
import torch.distributed as dist
import importlib

import taiji

__all__ = ["install_env_rendezvous"]


def _from_taiji_run() -> bool:
    return bool(os.environ.get("TAIJI_RENDEZVOUS")) and not (
        os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))


def _taiji_env_rendezvous(url: str, timeout: datetime.timedelta, **kwargs: Any
                          ) -> Iterator[Tuple[Any, int, int]]:
    from .process_group import _adoptable
    peer = taiji.Peer(init_timeout_ms=max(1, int(timeout.total_seconds() * 1000)))
    rank, size = peer.rank, peer.size
    for name, value in (("RANK", rank), ("WORLD_SIZE", size),
                        ("LOCAL_RANK", os.environ.get("TAIJI_LOCAL_RANK", rank)),
                        ("LOCAL_WORLD_SIZE", os.environ.get("TAIJI_LOCAL_SIZE", size))):
        os.environ.setdefault(name, str(value))
    host = os.environ.get("TAIJI_RENDEZVOUS", "127.0.0.1:0").rsplit(":", 1)[0]
    port = np.zeros(1, dtype=np.int64)
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        port[0] = store.port
    peer.broadcast(port, "torch.store_port", 0)
    if rank != 0:
        store = dist.TCPStore(host, int(port[0]), size, False, timeout)
    _adoptable.append(peer)
    yield store, rank, size
    raise RuntimeError("taiji-run rendezvous: cannot rendezvous again")


def install_env_rendezvous() -> None:
    """Wraps torch's ``env://`` handler (idempotent)."""
    # torch.distributed.rendezvous is also a function name: import the module by path.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    original = handlers.get("env")
    if original is None or getattr(original, "_taiji_wrapped", False):
        return

    def env_handler(url: str, timeout: datetime.timedelta = dist.default_pg_timeout,
                    **kwargs: Any):
        if _from_taiji_run():
            return _taiji_env_rendezvous(url, timeout, **kwargs)
        return original(url, timeout=timeout, **kwargs)

    env_handler._taiji_wrapped = True  # type: ignore[attr-defined]
    handlers["env"] = env_handler
