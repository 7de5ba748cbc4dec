"""F32, F16 and BF16: the unquantized types, as ggml converts them (round to nearest even)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import ld_f32, njit, njit_parallel, prange
from quantkit.quants.base import QuantType
from quantkit.quants.common import fp32_to_bf16, fp32_to_fp16, ld_bf16, ld_f16


@njit_parallel
def quantize_rows_f32(x, y, qw):
    for i in prange(x.shape[0]):
        y[i, :] = x[i].view(np.uint8)


@njit_parallel
def quantize_rows_f16(x, y, qw):
    for i in prange(x.shape[0]):
        out = y[i].view(np.uint16)
        for j in range(x.shape[1]):
            out[j] = fp32_to_fp16(x[i, j])


@njit_parallel
def quantize_rows_bf16(x, y, qw):
    for i in prange(x.shape[0]):
        out = y[i].view(np.uint16)
        for j in range(x.shape[1]):
            out[j] = fp32_to_bf16(x[i, j])


@njit
def dequantize_row_f32(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_f32(src, 4 * j)


@njit
def dequantize_row_f16(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_f16(src, 2 * j)


@njit
def dequantize_row_bf16(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_bf16(src, 2 * j)


class F32(QuantType, qtype=T.F32):
    """float32 values as they are, 4 bytes each."""
    uses_imatrix = False
    quantize_rows = quantize_rows_f32
    dequantize_row = dequantize_row_f32


class F16(QuantType, qtype=T.F16):
    """IEEE half, 2 bytes a value, rounded to nearest even (``ggml_fp32_to_fp16_row``)."""
    uses_imatrix = False
    quantize_rows = quantize_rows_f16
    dequantize_row = dequantize_row_f16


class BF16(QuantType, qtype=T.BF16):
    """bfloat16: the top half of the float32, rounded to nearest even, NaN kept quiet."""
    uses_imatrix = False
    quantize_rows = quantize_rows_bf16
    dequantize_row = dequantize_row_bf16
