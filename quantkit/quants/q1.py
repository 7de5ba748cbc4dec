"""Q1_0: one bit per value -- its sign -- and one fp16 scale per 128 values, the mean absolute value.

Block (18 bytes): ``d`` (fp16), ``qs[16]``: value j is bit ``j % 8`` of byte ``j // 8``; a set bit
means ``+d`` (the value was ``>= 0``, so -0.0 too), a clear bit ``-d``.

Bit-exact with ggml's ``quantize_row_q1_0_ref`` (``quantize_q1_0`` runs it row by row whether or not
``quant_weights`` is given, so the weights never change the bytes) and ``dequantize_row_q1_0``.
gguf-py 0.19 knows the type's sizes but has no dequantizer for it.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit
from quantkit.quants.base import QuantType
from quantkit.quants.common import block_layout, get_f16, put_f16

QK1_0 = 128
_BYTES, _D, _QS = block_layout("Q1_0", "d", "qs")


@njit
def quantize_block_q1_0(x, y, pos):
    s = np.float32(0.0)
    for j in range(QK1_0):
        s += np.abs(x[j])
    put_f16(y, pos + _D, s / np.float32(QK1_0))
    for b in range(QK1_0 // 8):
        q = 0
        for i in range(8):
            q |= (1 if x[8 * b + i] >= np.float32(0.0) else 0) << i
        y[pos + _QS + b] = np.uint8(q)


@njit
def quantize_row_q1_0_ref(x, y):
    for ib in range(x.shape[0] // QK1_0):
        quantize_block_q1_0(x[QK1_0 * ib:QK1_0 * (ib + 1)], y, _BYTES * ib)


@njit(inline="always")
def dequantize_block_q1_0(src, y):
    """One block's bytes -> float32, as ggml's ``dequantize_row_q1_0``."""
    d = get_f16(src, _D)
    for j in range(QK1_0):
        y[j] = d if (src[_QS + j // 8] >> (j % 8)) & 1 else -d


class Q1_0(QuantType, qtype=T.Q1_0):
    """18 bytes per 128: fp16 d, qs[16] (the signs)."""
    uses_imatrix = False
    quantize_row_ref = quantize_row_q1_0_ref
    dequantize_block = dequantize_block_q1_0
