"""Run a piece of Python on N processes as real taiji peers on loopback.

    results = run_peers(body, n, timeout=60, env=None, check=True, host="parent",
                        args=None)

``body`` is Python source (dedented; it runs as the script's main code) or a function
taking no arguments (its source is copied, then it is called). In it, ``RANK``, ``SIZE``,
``np`` and ``taiji`` are defined and ``emit(obj)`` records a JSON-serialisable result;
``peer()`` makes the taiji.Peer of the job from the environment. ``args`` (a
JSON-serialisable object) is available as ``ARGS``.

Each process gets TAIJI_RANK, TAIJI_WORLD_SIZE, TAIJI_RENDEZVOUS, TAIJI_RENDEZVOUS_HOST,
a TAIJI_JOB_ID unique per call, TAIJI_LIBRARY and PYTHONPATH=<repo>/python, plus ``env``.
``host="parent"`` serves the rendezvous from this process (a taiji.RendezvousServer on a
port the system chose: no port race) and every rank gets TAIJI_RENDEZVOUS_HOST=0;
``host="rank0"`` lets rank 0 serve it on a free port, as a plain launcher would.

All processes are waited for up to ``timeout`` seconds; on a timeout every one still
running is killed and AssertionError names the ranks that hung. With ``check`` a non-zero
exit is an AssertionError carrying that rank's output. Returns one ``PeerResult`` per rank
(``rank``, ``returncode``, ``stdout``, ``stderr``, ``results``: the emitted objects).
"""
from __future__ import annotations

import inspect
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
LIBRARY = os.environ.get("TAIJI_LIBRARY") or str(REPO / "build" / "capi" / "libtaiji.so")
_MARK = "@@taiji-result@@ "

_PRELUDE = '''\
import json, os, sys
import numpy as np
import taiji
RANK = int(os.environ["TAIJI_RANK"])
SIZE = int(os.environ["TAIJI_WORLD_SIZE"])
ARGS = json.loads(os.environ.get("TAIJI_TEST_ARGS", "null"))
def emit(obj):
    print({mark!r} + json.dumps(obj), flush=True)
def peer(**kwargs):
    return taiji.Peer(**kwargs)
'''.format(mark=_MARK)


@dataclass
class PeerResult:
    rank: int
    returncode: Optional[int]
    stdout: str
    stderr: str
    results: List[Any] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_master_port() -> int:
    """A MASTER_PORT whose next port is free too: taiji's rendezvous listens on
    MASTER_PORT + 1, and an ephemeral port picked alone may have a busy neighbour."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no free pair of adjacent ports on 127.0.0.1")


def _script(body: Union[str, Callable[[], Any]]) -> str:
    if callable(body):
        source = textwrap.dedent(inspect.getsource(body))
        return _PRELUDE + source + f"\n{body.__name__}()\n"
    return _PRELUDE + textwrap.dedent(body)


def run_peers(body: Union[str, Callable[[], Any]], n: int, timeout: float = 60,
              env: Optional[Dict[str, str]] = None, check: bool = True,
              host: str = "parent", args: Any = None) -> List[PeerResult]:
    assert 1 <= n <= 8, "run_peers runs 1..8 processes"
    server = None
    if host == "parent":
        sys.path.insert(0, str(REPO / "python"))
        os.environ.setdefault("TAIJI_LIBRARY", LIBRARY)
        import taiji
        server = taiji.RendezvousServer("127.0.0.1:0")
        address = server.address
    else:
        address = f"127.0.0.1:{free_port()}"
    job = "test-" + uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="taiji-peers-") as tmp:
        path = pathlib.Path(tmp) / "body.py"
        path.write_text(_script(body))
        procs = []
        for rank in range(n):
            e = dict(os.environ)
            e.update({
                "TAIJI_RANK": str(rank), "TAIJI_WORLD_SIZE": str(n),
                "TAIJI_RENDEZVOUS": address,
                "TAIJI_RENDEZVOUS_HOST": "1" if (host == "rank0" and rank == 0) else "0",
                "TAIJI_JOB_ID": job, "TAIJI_LIBRARY": LIBRARY,
                "PYTHONPATH": str(REPO / "python"),
                "TAIJI_TEST_ARGS": json.dumps(args),
            })
            e.update(env or {})
            # Files, not pipes: a rank that writes much cannot block while we wait for
            # another.
            out = open(pathlib.Path(tmp) / f"out{rank}", "w+")
            err = open(pathlib.Path(tmp) / f"err{rank}", "w+")
            procs.append((subprocess.Popen([PYTHON, str(path)], env=e, cwd=tmp, stdout=out,
                                           stderr=err), out, err))
        try:
            outputs = _wait_all(procs, timeout)
        finally:
            if server is not None:
                server.stop()
    procs = [p for p, _, _ in procs]
    results = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        emitted = [json.loads(line[len(_MARK):]) for line in out.splitlines()
                   if line.startswith(_MARK)]
        results.append(PeerResult(rank, proc.returncode, out, err, emitted))
    if check:
        for r in results:
            assert r.returncode == 0, (
                f"rank {r.rank} of {n} exited with {r.returncode}\n--- stdout\n{r.stdout}"
                f"\n--- stderr\n{r.stderr}")
    return results


def _wait_all(procs: List[Any], timeout: float) -> List[Any]:
    deadline = time.monotonic() + timeout
    hung = []
    for rank, (proc, _, _) in enumerate(procs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(rank)
    for rank in hung:
        procs[rank][0].kill()
        procs[rank][0].wait()
    outputs = []
    for _, out, err in procs:
        out.seek(0)
        err.seek(0)
        outputs.append((out.read(), err.read()))
        out.close()
        err.close()
    if hung:
        details = [f"--- rank {rank} stdout\n{outputs[rank][0]}\n--- rank {rank} stderr\n"
                   f"{outputs[rank][1]}" for rank in hung]
        raise AssertionError(f"ranks {hung} of {len(procs)} still running after {timeout} s "
                             "(killed)\n" + "\n".join(details))
    return outputs
