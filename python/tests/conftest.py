"""pytest set-up: the package from the source tree, the build tree's library, and the
multi-process helper (``run_peers`` fixture; see peers.py)."""
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import peers  # noqa: E402

os.environ.setdefault("TAIJI_LIBRARY", peers.LIBRARY)


@pytest.fixture
def run_peers():
    """The peers.run_peers function."""
    return peers.run_peers
