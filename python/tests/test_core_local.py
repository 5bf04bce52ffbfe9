"""One-process checks: library lookup, types, errors, topologies, argument checking."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import peers
import taiji


def test_library_lookup_prefers_the_environment(tmp_path):
    code = "import taiji; taiji.load_library()"
    env = dict(os.environ, TAIJI_LIBRARY=str(tmp_path / "missing.so"),
               PYTHONPATH=str(peers.REPO / "python"))
    out = subprocess.run([peers.PYTHON, "-c", code], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode != 0
    assert "missing.so (no such file)" in out.stderr


def test_library_found_in_the_build_tree_without_the_environment():
    code = "import taiji, sys; print(taiji.load_library()._name)"
    env = {k: v for k, v in os.environ.items() if k != "TAIJI_LIBRARY"}
    env["PYTHONPATH"] = str(peers.REPO / "python")
    out = subprocess.run([peers.PYTHON, "-c", code], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(peers.REPO / "build" / "capi" / "libtaiji.so")


def test_import_does_not_import_torch():
    code = "import sys, taiji, numpy; taiji.version(); print('torch' in sys.modules)"
    out = subprocess.run([peers.PYTHON, "-c", code], capture_output=True, text=True,
                         timeout=30, env=dict(os.environ, PYTHONPATH=str(peers.REPO / "python")))
    assert out.stdout.strip() == "False", out.stderr


def test_ops_and_dtypes_match_the_c_enums():
    assert (taiji.SUM, taiji.PROD, taiji.MIN, taiji.MAX, taiji.AVG) == (0, 1, 2, 3, 4)
    assert [taiji.reduce_op_name(op) for op in taiji.ReduceOp] == [
        "sum", "prod", "min", "max", "avg"]
    names = {np.float32: "f32", np.float64: "f64", np.float16: "f16", np.int8: "i8",
             np.uint8: "u8", np.int32: "i32", np.uint32: "u32", np.int64: "i64",
             np.uint64: "u64"}
    for npt, name in names.items():
        assert taiji.dtype_name(npt) == name
        assert taiji.dtype_size(npt) == np.dtype(npt).itemsize
    assert taiji.dtype_name(taiji.DType.BF16) == "bf16"
    assert taiji.dtype_size(taiji.DType.BF16) == 2
    with pytest.raises(TypeError):
        taiji.to_dtype(np.complex64)
    with pytest.raises(TypeError):
        taiji.to_dtype(np.bool_)


def test_torch_dtypes_map():
    torch = pytest.importorskip("torch")
    assert taiji.to_dtype(torch.bfloat16) == taiji.DType.BF16
    assert taiji.to_dtype(torch.float16) == taiji.DType.F16
    assert taiji.to_dtype(torch.int64) == taiji.DType.I64
    with pytest.raises(TypeError):
        taiji.to_dtype(torch.complex64)


def test_one_error_class_per_status():
    expected = {-1: taiji.InvalidArgument, -2: taiji.NoMemory, -3: taiji.Timeout,
                -4: taiji.Mismatch, -5: taiji.PeerLost, -6: taiji.Duplicate,
                -7: taiji.StaleVersion, -8: taiji.ProtocolError, -9: taiji.IOFailure,
                -10: taiji.ConfigError, -11: taiji.Aborted, -12: taiji.Finalized,
                -13: taiji.VersionMismatch, -14: taiji.InternalError,
                -15: taiji.Unsupported, -16: taiji.BootstrapError, -17: taiji.AuthError,
                -18: taiji.NotFoundError, -19: taiji.NoDeviceError}
    for status, cls in expected.items():
        assert taiji.error_class(status) is cls
        err = cls(status, "the peer's words")
        assert err.status == status
        assert err.status_name == taiji.status_name(status)
        assert "the peer's words" in str(err) and err.status_name in str(err)
    assert taiji.error_class(-999) is taiji.TaijiError
    assert taiji.status_name(-3) == "TAIJI_ERR_TIMEOUT"
    assert issubclass(taiji.Timeout, TimeoutError)


def test_topologies_build_and_round_trip():
    ring = taiji.Topology.from_name("ring", size=4)
    assert ring.size == 4 and ring.digest != 0
    again = taiji.Topology.from_text(ring.text, size=4)
    assert again.digest == ring.digest and again == ring
    star = taiji.Topology.from_parents(3, [[-1, 0, 0]], [[-1, 0, 0]])
    edges = taiji.Topology.from_edges(3, [[(1, 0), (2, 0)]], [[(1, 0), (2, 0)]])
    assert star.digest == edges.digest and star.size == 3
    with pytest.raises(taiji.InvalidArgument) as info:
        taiji.Topology.from_parents(3, [[-1, 2, 1]], [[-1, 0, 0]])
    assert info.value.message
    with pytest.raises(ValueError):
        taiji.Topology.from_parents(3, [[-1, 0]], [[-1, 0, 0]])
    with pytest.raises(taiji.InvalidArgument):
        taiji.Topology.from_text("no-such-shape", size=3)


def test_rendezvous_server_reports_its_port():
    with taiji.RendezvousServer() as server:
        host, port = server.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
    with pytest.raises(taiji.InvalidArgument):
        taiji.RendezvousServer("no port")


def test_config_errors_are_raised_with_their_text():
    with pytest.raises(taiji.InvalidArgument) as info:
        taiji.Peer(rank=0, size=1, settings={"TAIJI_NO_SUCH_SETTING": "1"})
    assert "TAIJI_NO_SUCH_SETTING" in str(info.value)
    with pytest.raises(TypeError):
        taiji.Peer(rank="0", size=1)


def test_pip_installs_the_package_without_network(tmp_path):
    # From a copy: setuptools writes its build directory next to the sources.
    source = tmp_path / "python"
    shutil.copytree(peers.REPO / "python", source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    target = tmp_path / "site"
    out = subprocess.run([peers.PYTHON, "-m", "pip", "install", "--quiet", "--no-build-isolation",
                          "--no-deps", "--no-index", "--target", str(target), str(source)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "taiji" / "torch" / "process_group.py").is_file()
    code = ("import taiji, numpy as np; assert taiji.__file__.startswith(%r)\n"
            "with taiji.Peer(rank=0, size=1, job_id='pip') as p:\n"
            "    print(p.allreduce(np.ones(2, np.float32), 'x').tolist())" % str(target))
    env = dict(os.environ, PYTHONPATH=str(target))
    ran = subprocess.run([peers.PYTHON, "-c", code], env=env, capture_output=True, text=True,
                         timeout=30, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[1.0, 1.0]"
