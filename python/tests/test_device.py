"""Device buffers on a machine without a GPU: they fail at once with NoDeviceError saying
why, host ops are untouched, TAIJI_NCCL=on refuses to start, and tensors placed anywhere
but the CPU or a CUDA device are refused before anything is posted."""
import ctypes

import numpy as np
import pytest

import taiji
from taiji import _buffers, _lib


def _device_allreduce(peer, array):
    """taiji_allreduce with options.memory = TAIJI_MEMORY_DEVICE on the array's memory."""
    options = _lib.OpOptions()
    options.memory = _lib.MEMORY_DEVICE
    status = _lib.lib().taiji_allreduce(peer._handle, b"on.device", array.ctypes.data, array.ctypes.data,
                                        array.size, int(taiji.DType.F32), int(taiji.SUM),
                                        ctypes.byref(options), None)
    return int(status), peer.last_error()


def test_device_memory_without_a_gpu_is_no_device_and_host_ops_run():
    with taiji.Peer(rank=0, size=1, job_id="nodevice") as peer:
        x = np.ones(4, dtype=np.float32)
        status, why = _device_allreduce(peer, x)
        assert status == -19 and taiji.error_class(status) is taiji.NoDeviceError
        # It says why: no CUDA runtime, no device, or a build without NCCL.
        assert any(w in why for w in ("GPU", "CUDA", "cuda", "without NCCL")), why
        assert "'on.device'" in why
        out = peer.allreduce(x, "on.host")
        assert out.tolist() == [1.0] * 4


def test_nccl_off_names_the_setting():
    with taiji.Peer(rank=0, size=1, job_id="ncclloff", settings={"TAIJI_NCCL": "off"}) as peer:
        status, why = _device_allreduce(peer, np.ones(2, dtype=np.float32))
        assert status == -19 and "TAIJI_NCCL=off" in why


def test_nccl_on_without_a_gpu_refuses_to_start():
    with pytest.raises(taiji.ConfigError, match="TAIJI_NCCL=on"):
        taiji.Peer(rank=0, size=1, job_id="ncclon", settings={"TAIJI_NCCL": "on"})


def test_host_buffers_are_host_memory_without_asking_cuda():
    a = _buffers.as_input(np.zeros(3, dtype=np.float32))
    assert _buffers.memory_of([a, _buffers.as_output(np.zeros(3, dtype=np.float32))]) == (_lib.MEMORY_HOST, None)


def test_tensors_off_cpu_and_cuda_are_refused():
    torch = pytest.importorskip("torch")
    meta = torch.empty(4, device="meta")
    with pytest.raises(TypeError, match="CPU and CUDA"):
        _buffers.as_input(meta)
