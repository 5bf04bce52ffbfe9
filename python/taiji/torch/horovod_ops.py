"""Horovod's reduction operators and gradient compression, over taiji's values (part of
the Horovod-style API; ``taiji.torch.horovod`` re-exports every name)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

import taiji

# ---- reduction operators ------------------------------------------------------------

# Horovod's operators are module constants compared by identity; ours carry taiji's value.
class _ReduceOp:
    def __init__(self, name: str, value: Optional[int]):
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"taiji.torch.{self.name}"


Average = _ReduceOp("Average", taiji.AVG)
Sum = _ReduceOp("Sum", taiji.SUM)
Min = _ReduceOp("Min", taiji.MIN)
Max = _ReduceOp("Max", taiji.MAX)
Product = _ReduceOp("Product", taiji.PROD)
# Kept so that scripts naming it import; using it raises (see _taiji_op).
Adasum = _ReduceOp("Adasum", None)

# A failed collective raises taiji.TaijiError (or its subclass for the status); Horovod's
# name for it is kept so `except hvd.HorovodInternalError` keeps working.
HorovodInternalError = taiji.TaijiError


def _taiji_op(op: Optional[_ReduceOp], average: Optional[bool] = None) -> int:
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or the deprecated average, not both")
        op = Average if average else Sum
    if op is None:
        op = Average
    if op is Adasum:
        raise NotImplementedError("Adasum is not supported by taiji; use Average or Sum")
    if not isinstance(op, _ReduceOp):
        raise TypeError(f"op must be one of Average, Sum, Min, Max, Product, not {op!r}")
    return op.value


# ---- compression --------------------------------------------------------------------

class Compressor:
    """Compresses a tensor before its allreduce and restores it after (Horovod's interface)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast_compressor(name: str, wire: torch.dtype):
    class _Cast(Compressor):
        __doc__ = (f"Floating-point tensors travel as {name}; taiji reduces them in f32 and "
                   "rounds each step back to nearest-even. Other tensors pass unchanged.")

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != wire:
                return tensor.to(wire), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)

    _Cast.__name__ = _Cast.__qualname__ = f"{name.upper()}Compressor"
    return _Cast


FP16Compressor = _cast_compressor("fp16", torch.float16)
BF16Compressor = _cast_compressor("bf16", torch.bfloat16)


class Compression:
    """Gradient compression for allreduce: ``none`` (default), ``fp16``, ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
