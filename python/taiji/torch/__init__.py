"""taiji for PyTorch.

Importing this package registers the torch.distributed backend ``"taiji"``
(:class:`ProcessGroupTaiji`), so ``dist.init_process_group("taiji")`` works under
``taiji-run`` and under ``torchrun``; :mod:`taiji.torch.hooks` has DDP comm hooks. The
Horovod-style API (``init``, ``allreduce``, ``DistributedOptimizer``, ...) lives here too:
``import taiji.torch as hvd``, and ``hvd.elastic`` its elastic training. The
synchronisation modes (``SyncOptimizer`` and its wrappers) and ``AdaptiveOptimizer``, which
switches between them, are here too. See docs/python-torch.md, docs/python-horovod.md,
docs/elastic-python.md and docs/python-adaptive.md.
"""
from __future__ import annotations

from . import process_group as _process_group
from .launch import install_env_rendezvous as _install_env_rendezvous
from .process_group import BACKEND_NAME, ProcessGroupTaiji, WorkTaiji, peer_of

_process_group._register()
_install_env_rendezvous()

from . import hooks  # noqa: E402  (after the backend exists)
from .horovod import *  # noqa: E402,F401,F403
from .horovod import __all__ as _horovod_all  # noqa: E402
from . import elastic  # noqa: E402  (over the Horovod-style API)
from . import sync_rules  # noqa: E402
from .adaptive import AdaptiveOptimizer, Switch  # noqa: E402
from .sync_modes import (LocalSGDOptimizer, PairAveragingOptimizer,  # noqa: E402
                         SyncOptimizer, SynchronousAveragingOptimizer,
                         SynchronousSGDOptimizer)

__all__ = (["ProcessGroupTaiji", "WorkTaiji", "BACKEND_NAME", "peer_of", "hooks", "elastic",
            "sync_rules", "AdaptiveOptimizer", "Switch", "SyncOptimizer",
            "SynchronousSGDOptimizer", "SynchronousAveragingOptimizer", "PairAveragingOptimizer", "LocalSGDOptimizer"]
           + list(_horovod_all))
