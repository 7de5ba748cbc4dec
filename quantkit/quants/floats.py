"""F32, F16 and BF16: the unquantized types, as ggml converts them (round to nearest even)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import ld_f32, njit
from quantkit.quants.base import QuantType
from quantkit.quants.common import fp32_to_bf16, fp32_to_fp16, ld_bf16, ld_f16


@njit
def _quantize_row(x, y, kind):
    """float32 -> float32 bytes (``kind`` 0), fp16 (1, ``ggml_fp32_to_fp16_row``) or bfloat16 (2,
    ``ggml_fp32_to_bf16_row_ref``)."""
    if kind == 0:
        y[:] = x.view(np.uint8)
        return
    out = y.view(np.uint16)
    if kind == 1:
        for j in range(x.shape[0]):
            out[j] = fp32_to_fp16(x[j])
    else:
        for j in range(x.shape[0]):
            out[j] = fp32_to_bf16(x[j])


@njit
def _dequantize_row(src, y, kind):
    """One row's bytes -> float32, ``kind`` as ``_quantize_row``'s."""
    if kind == 0:
        for j in range(y.shape[0]):
            y[j] = ld_f32(src, 4 * j)
    elif kind == 1:
        for j in range(y.shape[0]):
            y[j] = ld_f16(src, 2 * j)
    else:
        for j in range(y.shape[0]):
            y[j] = ld_bf16(src, 2 * j)


class _Float(QuantType):
    """The three float types: one row function and one decoder, the type's ``kind`` as a constant."""
    uses_imatrix = False
    quantize_row_ref = _quantize_row
    dequantize_row = _dequantize_row

    def __init_subclass__(cls, qtype: T, kind: int) -> None:
        cls.row_args = cls.deq_args = (kind,)
        super().__init_subclass__(qtype=qtype)


class F32(_Float, qtype=T.F32, kind=0):
    """float32 values as they are, 4 bytes each."""


class F16(_Float, qtype=T.F16, kind=1):
    """IEEE half, 2 bytes a value, rounded to nearest even."""


class BF16(_Float, qtype=T.BF16, kind=2):
    """bfloat16: the top half of the float32, rounded to nearest even, NaN kept quiet."""
