"""MXFP4: the OCP microscaling FP4 format -- 32 values share one E8M0 exponent byte, each value is an
E2M1 float (4 bits: sign + {0, 0.5, 1, 1.5, 2, 3, 4, 6}).

Block (17 bytes): ``e`` (uint8 biased exponent), ``qs[16]``: value j in the low nibble of byte j,
value j + 16 in the high nibble. ggml keeps the E2M1 values doubled as int8 (``kvalues_mxfp4``: 0, 1, 2,
3, 4, 6, 8, 12 and their negatives) and halves the scale instead (``GGML_E8M0_TO_FP32_HALF(e)`` =
2**(e - 128)).

Bit-exact with ggml's ``quantize_row_mxfp4_ref`` (``quantize_mxfp4`` ignores ``quant_weights``):
``e = floorf(log2f(amax)) - 2 + 127`` (0 for an all-zero block), then each value takes the first table
entry with the smallest ``|kvalue * d - x|``; and with ``dequantize_row_mxfp4``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import bits_to_f32, njit
from quantkit.quants.base import QuantType
from quantkit.quants.common import block_layout, c_f2i

QK_MXFP4 = 32
_BYTES, _E, _QS = block_layout("MXFP4", "e", "qs")

#: ggml's kvalues_mxfp4: the E2M1 values times two, indexed by the 4-bit code (the same list as gguf-py's)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_KV_F32 = KVALUES_MXFP4.astype(np.float32)


@njit
def e8m0_to_fp32_half(e):
    """``GGML_E8M0_TO_FP32_HALF``: 2**(e - 128) built from its bits (subnormal for e < 2)."""
    e = np.uint32(e)
    if e < 2:
        return bits_to_f32(np.uint32(0x00200000) << e)
    return bits_to_f32((e - np.uint32(1)) << np.uint32(23))


@njit
def _best_indices(x, d, best, best_err):
    """``best[j]``: the first table entry with the smallest ``|kvalue * d - x[j]|`` (ggml's
    ``best_index_mxfp4``), for the 32 values of a block at once (the loop over values vectorizes)."""
    kv = _KV_F32
    for j in range(QK_MXFP4):
        best[j] = 0
        best_err[j] = np.abs(kv[0] * d - x[j])
    for i in range(1, 16):
        for j in range(QK_MXFP4):
            err = np.abs(kv[i] * d - x[j])
            take = err < best_err[j]
            best[j] = i if take else best[j]
            best_err[j] = err if take else best_err[j]


@njit
def quantize_block_mxfp4(x, y, pos, best, best_err):
    amax = np.float32(0.0)
    for j in range(QK_MXFP4):
        a = np.abs(x[j])
        if amax < a:
            amax = a
    e = 0
    if amax > np.float32(0.0):
        # (uint8_t) of a float: x86 converts to int32 and keeps the low byte
        e = c_f2i(np.float32(np.floor(np.log2(amax))) - np.float32(2.0) + np.float32(127.0)) & 0xFF
    y[pos + _E] = np.uint8(e)
    _best_indices(x, e8m0_to_fp32_half(e), best, best_err)
    for j in range(QK_MXFP4 // 2):
        y[pos + _QS + j] = np.uint8(best[j] | (best[j + 16] << 4))


@njit
def quantize_row_mxfp4_ref(x, y):
    best = np.empty(QK_MXFP4, dtype=np.int32)
    best_err = np.empty(QK_MXFP4, dtype=np.float32)
    for ib in range(x.shape[0] // QK_MXFP4):
        quantize_block_mxfp4(x[QK_MXFP4 * ib:QK_MXFP4 * (ib + 1)], y, _BYTES * ib, best, best_err)


@njit
def _e2m1x2(c):
    """``kvalues_mxfp4[c]`` computed, not looked up (so the decoder's loop vectorizes): magnitude code
    m = c & 7 is m for m < 4, else (2 + (m & 1)) << ((m >> 1) - 1); bit 3 is the sign (an integer 0,
    so code 8 is +0 like the table's)."""
    m = np.int32(c) & 7
    v = m if m < 4 else (2 + (m & 1)) << ((m >> 1) - 1)
    return np.float32(-v if c & 8 else v)


@njit(inline="always")
def dequantize_block_mxfp4(src, y):
    """One block's bytes -> float32, as ggml's ``dequantize_row_mxfp4``."""
    d = e8m0_to_fp32_half(src[_E])
    for j in range(16):
        b = np.int32(src[_QS + j])
        y[j] = _e2m1x2(b & 0xF) * d
        y[16 + j] = _e2m1x2(b >> 4) * d


class MXFP4(QuantType, qtype=T.MXFP4):
    """17 bytes per 32: the E8M0 exponent e, qs[16] (E2M1 codes, value j + 16 in the high nibbles)."""
    uses_imatrix = False
    quantize_row_ref = quantize_row_mxfp4_ref
    dequantize_block = dequantize_block_mxfp4
