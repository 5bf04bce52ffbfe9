"""Peers that find each other through etcd (TAIJI_RENDEZVOUS=etcd://HOST:PORT/PREFIX): a
real etcd, started here on loopback and stopped after the module."""
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from peers import free_port, run_peers


@pytest.fixture(scope="module")
def etcd():
    assert shutil.which("etcd"), "etcd is not installed: run scripts/setup.sh (it installs etcd-server)"
    data = tempfile.mkdtemp(prefix="taiji-etcd-")
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    log = open(f"{data}/etcd.log", "w")
    proc = subprocess.Popen(
        ["etcd", "--name", "t", "--data-dir", f"{data}/data", "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(client + "/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        break
            except OSError:
                pass
            assert proc.poll() is None, open(f"{data}/etcd.log").read()
            assert time.monotonic() < deadline, "etcd did not become healthy within 20 s"
            time.sleep(0.1)
        yield client.replace("http://", "etcd://")
    finally:
        proc.kill()
        proc.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)


def _allreduce_body():
    with peer() as p:
        out = p.allreduce(np.full(1000, RANK + 1, dtype=np.int64), name="x")
        emit([int(out[0]), int(out[-1]), p.rank, p.size])


def test_three_peers_rendezvous_through_etcd(etcd):
    # Two jobs at once on one etcd: their prefixes keep them apart.
    for prefix in ("job-a", "job-b"):
        results = run_peers(_allreduce_body, 3, env={"TAIJI_RENDEZVOUS": f"{etcd}/{prefix}"})
        assert [r.results for r in results] == [[[6, 6, r, 3]] for r in range(3)]


def test_bad_etcd_address_is_a_config_error(etcd):
    import os
    import sys
    from peers import LIBRARY, REPO
    sys.path.insert(0, str(REPO / "python"))
    os.environ.setdefault("TAIJI_LIBRARY", LIBRARY)
    import taiji
    with pytest.raises(taiji.TaijiError) as e:
        taiji.Peer(rank=0, size=2, rendezvous="etcd://127.0.0.1:99999/x")
    assert "etcd://127.0.0.1:99999/x" in str(e.value)
    assert "bad port" in str(e.value)


def _unreachable_body():
    import time as t
    t0 = t.monotonic()
    try:
        peer(init_timeout_ms=1000)
    except taiji.TaijiError as e:
        emit([type(e).__name__, str(e), t.monotonic() - t0])


def test_unreachable_etcd_fails_bootstrap_within_the_init_timeout():
    address = f"etcd://127.0.0.1:{free_port()}/nobody"
    results = run_peers(_unreachable_body, 2, env={"TAIJI_RENDEZVOUS": address}, timeout=30)
    for r in results:
        [(kind, text, took)] = r.results
        assert kind == "BootstrapError", (kind, text)
        assert address.split("/nobody")[0][len("etcd://"):] in text, text
        assert took < 5, took


def test_taiji_run_with_an_etcd_store(etcd, tmp_path):
    import os
    from peers import LIBRARY, PYTHON, REPO
    script = tmp_path / "body.py"
    script.write_text(
        "import os, numpy as np, taiji\n"
        "assert os.environ['TAIJI_RENDEZVOUS'].startswith('etcd://')\n"
        "with taiji.Peer() as p:\n"
        "    out = p.allreduce(np.full(10, p.rank + 1, dtype=np.int64), name='x')\n"
        "    print('sum', int(out[0]))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TAIJI_LIBRARY=LIBRARY)
    run = subprocess.run(["taiji-run", "-np", "3", "--timeout", "60", "--store", f"{etcd}/launcher",
                          PYTHON, str(script)], env=env, capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(line.split()[-2:] for line in run.stdout.splitlines()) == [["sum", "6"]] * 3, run.stdout
    bad = subprocess.run(["taiji-run", "-np", "2", "--store", "etcd://nowhere", PYTHON, str(script)],
                         env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "bad --store 'etcd://nowhere'" in bad.stderr, bad.stderr
    both = subprocess.run(["taiji-run", "-np", "2", "--port", "1234", "--store", f"{etcd}/x", PYTHON,
                           str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert both.returncode == 2 and "exclude each other" in both.stderr, both.stderr
