"""Reduction operators and element types, mapped from NumPy and torch dtypes.

torch is never imported here: a torch dtype is recognised by its text ("torch.float32"),
so the package works, and stays light, without torch installed.
"""
from __future__ import annotations

import enum
from typing import Any

import numpy as np

from . import _lib


class ReduceOp(enum.IntEnum):
    """taiji_reduce_op_t; the members are plain ints equal to the C enum."""
    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


class DType(enum.IntEnum):
    """taiji_dtype_t."""
    F32 = 0
    F64 = 1
    F16 = 2
    BF16 = 3
    I8 = 4
    U8 = 5
    I32 = 6
    U32 = 7
    I64 = 8
    U64 = 9


SUM, PROD, MIN, MAX, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG

_NUMPY = {
    np.dtype(np.float32): DType.F32, np.dtype(np.float64): DType.F64,
    np.dtype(np.float16): DType.F16, np.dtype(np.int8): DType.I8,
    np.dtype(np.uint8): DType.U8, np.dtype(np.int32): DType.I32,
    np.dtype(np.uint32): DType.U32, np.dtype(np.int64): DType.I64,
    np.dtype(np.uint64): DType.U64,
}
_TORCH = {
    "torch.float32": DType.F32, "torch.float64": DType.F64, "torch.float16": DType.F16,
    "torch.bfloat16": DType.BF16, "torch.int8": DType.I8, "torch.uint8": DType.U8,
    "torch.int32": DType.I32, "torch.int64": DType.I64,
    # torch 1.13 has no uint32/uint64; later versions spell them so.
    "torch.uint32": DType.U32, "torch.uint64": DType.U64,
}


def is_torch_dtype(obj: Any) -> bool:
    return type(obj).__module__ == "torch" and type(obj).__name__ == "dtype"


def to_dtype(obj: Any) -> DType:
    """A DType from a DType/int, a NumPy dtype (or anything np.dtype() takes) or a torch
    dtype. TypeError for a type taiji does not reduce (complex, bool, ...)."""
    if isinstance(obj, DType):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        try:
            return DType(obj)
        except ValueError:
            raise TypeError(f"{obj} is not a taiji dtype value (0..9)") from None
    if is_torch_dtype(obj):
        try:
            return _TORCH[str(obj)]
        except KeyError:
            raise TypeError(f"taiji has no element type for {obj}") from None
    try:
        npd = np.dtype(obj)
    except TypeError:
        raise TypeError(f"not a dtype: {obj!r}") from None
    try:
        return _NUMPY[npd]
    except KeyError:
        raise TypeError(f"taiji has no element type for numpy dtype {npd}") from None


def dtype_name(dtype: Any) -> str:
    """The C library's name of the element type: "f32", "bf16", ..."""
    return _lib.text(_lib.lib().taiji_dtype_name(int(to_dtype(dtype))))


def dtype_size(dtype: Any) -> int:
    """Bytes per element."""
    return int(_lib.lib().taiji_dtype_size(int(to_dtype(dtype))))


def reduce_op_name(op: Any) -> str:
    """"sum", "prod", "min", "max" or "avg"."""
    return _lib.text(_lib.lib().taiji_reduce_op_name(int(to_reduce_op(op))))


def to_reduce_op(op: Any) -> ReduceOp:
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise ValueError(f"unknown reduce op {op!r}") from None
    if isinstance(op, bool) or not isinstance(op, int):
        raise TypeError(f"reduce op must be a taiji.ReduceOp, got {op!r}")
    try:
        return ReduceOp(op)
    except ValueError:
        raise ValueError(f"unknown reduce op {op}") from None
