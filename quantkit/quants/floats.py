"""F32, F16 and BF16: the unquantized types, as ggml converts them (round to nearest even)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import ld_f32, njit_parallel, prange
from quantkit.quants.base import QuantType, build_kernel
from quantkit.quants.common import fp32_to_bf16, fp32_to_fp16, ld_bf16, ld_f16


@njit_parallel
def quantize_rows_f32(x, y, qw):
    for i in prange(x.shape[0]):
        y[i, :] = x[i].view(np.uint8)


def _quantize_rows_half_body(x, y, qw):
    """Every value to its 16-bit form by ``CONV`` (``fp32_to_fp16`` / ``fp32_to_bf16``); prange over rows.
    Built per type (``jit.specialize``): a call through a run-time choice was 1.5-5x slower."""
    for i in prange(x.shape[0]):
        out = y[i].view(np.uint16)
        for j in range(x.shape[1]):
            out[j] = CONV(x[i, j])  # noqa: F821


def _dequantize_row_body(src, y):
    """A row of ``W``-byte values read by ``LD`` (``ld_f32`` / ``ld_f16`` / ``ld_bf16``)."""
    for j in range(y.shape[0]):
        y[j] = LD(src, W * j)  # noqa: F821


class F32(QuantType, qtype=T.F32):
    """float32 values as they are, 4 bytes each."""
    uses_imatrix = False
    quantize_rows = quantize_rows_f32
    dequantize_row = build_kernel(_dequantize_row_body, T.F32, False, LD=ld_f32, W=4)


class F16(QuantType, qtype=T.F16):
    """IEEE half, 2 bytes a value, rounded to nearest even (``ggml_fp32_to_fp16_row``)."""
    uses_imatrix = False
    quantize_rows = build_kernel(_quantize_rows_half_body, T.F16, True, CONV=fp32_to_fp16)
    dequantize_row = build_kernel(_dequantize_row_body, T.F16, False, LD=ld_f16, W=2)


class BF16(QuantType, qtype=T.BF16):
    """bfloat16: the top half of the float32, rounded to nearest even, NaN kept quiet."""
    uses_imatrix = False
    quantize_rows = build_kernel(_quantize_rows_half_body, T.BF16, True, CONV=fp32_to_bf16)
    dequantize_row = build_kernel(_dequantize_row_body, T.BF16, False, LD=ld_bf16, W=2)
