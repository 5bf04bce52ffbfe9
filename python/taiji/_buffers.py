"""What a collective needs from a NumPy array or a torch tensor (CPU or CUDA): pointer,
element count, element type, where it lives, and an output allocated like the input.

Everything is checked before anything is posted: a wrong type, a non-contiguous or
read-only output, or sizes that do not fit raise TypeError/ValueError here.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import numpy as np

from ._types import DType, to_dtype


def is_tensor(x: Any) -> bool:
    """A torch tensor, recognised without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class Buffer:
    """A checked view of one array: ``ptr``, ``count`` (elements), ``dtype`` (DType),
    ``nbytes``, ``device`` (a CUDA tensor: the op runs over NCCL) and ``stream`` (its
    device's current CUDA stream, which the op is ordered against). Holds ``obj`` so the
    memory lives as long as the Buffer."""
    __slots__ = ("obj", "ptr", "count", "dtype", "nbytes", "torch", "device", "stream")

    def __init__(self, obj: Any, role: str, writable: bool) -> None:
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise TypeError(f"{role}: the array must be C-contiguous")
            if writable and not obj.flags.writeable:
                raise ValueError(f"{role}: the array is read-only")
            self.dtype = to_dtype(obj.dtype)
            self.ptr = obj.ctypes.data
            self.count = int(obj.size)
            self.nbytes = int(obj.nbytes)
            self.torch = False
            self.device = False
            self.stream = None
        elif is_tensor(obj):
            if obj.device.type not in ("cpu", "cuda"):
                raise TypeError(f"{role}: taiji takes CPU and CUDA tensors, got one on {obj.device}")
            if obj.layout.__repr__() != "torch.strided":
                raise TypeError(f"{role}: taiji takes dense (strided) tensors")
            if not obj.is_contiguous():
                raise TypeError(f"{role}: the tensor must be contiguous")
            if writable and obj.requires_grad and obj.is_leaf:
                raise ValueError(f"{role}: a leaf tensor that requires grad cannot be "
                                 "written in place; pass tensor.detach() or use out=")
            self.dtype = to_dtype(obj.dtype)
            self.ptr = obj.data_ptr()
            self.count = int(obj.numel())
            self.nbytes = self.count * obj.element_size()
            self.torch = True
            self.device = obj.device.type == "cuda"
            self.stream = None
            if self.device:
                torch = sys.modules["torch"]
                self.stream = torch.cuda.current_stream(obj.device).cuda_stream or None
        else:
            raise TypeError(f"{role}: expected a numpy.ndarray or a torch.Tensor, "
                            f"got {type(obj).__name__}")
        self.obj = obj


def as_input(x: Any, role: str = "input") -> Buffer:
    return Buffer(x, role, writable=False)


def as_output(x: Any, role: str = "out") -> Buffer:
    return Buffer(x, role, writable=True)


def allocate_like(x: Buffer, shape: Sequence[int]) -> Any:
    """A new uninitialised array of x's library and dtype with ``shape``."""
    if x.torch:
        torch = sys.modules["torch"]
        return torch.empty(tuple(shape), dtype=x.obj.dtype, device=x.obj.device)
    return np.empty(tuple(shape), dtype=x.obj.dtype)


def shape_of(x: Buffer) -> tuple:
    return tuple(x.obj.shape)


def output(x: Buffer, out: Optional[Any], count: int, shape: Sequence[int]) -> Buffer:
    """The output buffer: ``out`` checked against x (same dtype, ``count`` elements, same
    library), or a new array of ``shape``."""
    if out is None:
        return as_output(allocate_like(x, shape))
    o = as_output(out)
    if o.torch != x.torch:
        raise TypeError("out must be of the input's kind (numpy array or torch tensor)")
    if o.torch and o.obj.device != x.obj.device:
        raise TypeError(f"out is on {o.obj.device}, the input on {x.obj.device}")
    if o.dtype != x.dtype:
        raise TypeError(f"out has dtype {DType(o.dtype).name}, the input "
                        f"{DType(x.dtype).name}")
    if o.count != count:
        raise ValueError(f"out has {o.count} elements, the op needs {count}")
    return o


def memory_of(buffers: Sequence[Any]) -> tuple:
    """(taiji_memory_t, stream) for the Buffers of one op: device memory when they are
    CUDA tensors (all of them, on one device), host memory otherwise."""
    placed = [b for b in buffers if isinstance(b, Buffer)]
    if not any(b.device for b in placed):
        return 1, None  # TAIJI_MEMORY_HOST: the CUDA runtime need not be asked
    where = sorted({str(b.obj.device) if b.torch else "cpu" for b in placed})
    if len(where) > 1:
        raise TypeError("an op's tensors must all be on one device, got " + ", ".join(where))
    return 2, next(b.stream for b in placed if b.device)  # TAIJI_MEMORY_DEVICE
