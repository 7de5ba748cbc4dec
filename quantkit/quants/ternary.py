"""TQ1_0 and TQ2_0: ternary weights (BitNet b1.58, TriLMs) -- every value is -1, 0 or +1 times one fp16
scale per 256, the block's absolute maximum.

Bit-exact with ggml's ``quantize_row_tq1_0_ref`` / ``quantize_row_tq2_0_ref`` (``quantize_tq1_0`` and
``quantize_tq2_0`` ignore ``quant_weights``, so ``uses_imatrix = False``) and ``dequantize_row_tq*_0``:

* a trit is ``lroundf(x / amax) + 1`` in {0, 1, 2} (ties away from zero);
* TQ2_0 (66 bytes: qs[64], d): 2 bits per trit; byte ``32*j + m`` holds values ``128*j + m + 32*n``
  at bits ``2n`` for n = 0..3;
* TQ1_0 (54 bytes: qs[48], qh[4], d): five trits per byte as a base-3 number (first value most
  significant) scaled to a byte by ``ceil(q * 256 / 243)``, so a trit is read back as the top base-3
  digit of ``byte * 3**n`` (mod 256): ``((byte * 3**n) & 255) * 3 >> 8``. qs[0:32] hold values 0..159
  (byte m: m + 32*n), qs[32:48] values 160..239 (byte m: 160 + m + 16*n), and qh[4] the last 16, four
  trits per byte (byte j: 240 + j + 4*n) with a zero fifth trit.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit
from quantkit.quants.base import QuantType, build_kernel
from quantkit.quants.common import block_layout, get_f16, put_f16

QK_K = 256
_TQ1_BYTES, _TQ1_QS, _TQ1_QH, _TQ1_D = block_layout("TQ1_0", "qs", "qh", "d")
_TQ2_BYTES, _TQ2_QS, _TQ2_D = block_layout("TQ2_0", "qs", "d")


@njit
def _absmax_inv(x):
    """The block's absolute maximum (ggml's ``MAX`` loop) and its inverse (0 for an all-zero block)."""
    amax = np.float32(0.0)
    for j in range(x.shape[0]):
        a = np.abs(x[j])
        amax = amax if amax > a else a
    return amax, (np.float32(1.0) / amax if amax != np.float32(0.0) else np.float32(0.0))


@njit
def _trits(x, inv, t):
    """``t[j] = lroundf(x[j] * inv) + 1`` for a block. While ``inv`` is finite, ``|x * inv| <= 1`` up to
    rounding, so the rounding is two comparisons and the loop vectorizes. ``inv`` is inf only for a
    block whose maximum is below 2**-128: there every ``x * inv`` is +-inf or NaN, for which x86's
    ``lroundf`` returns LONG_MIN, and ggml's ``int xi = lroundf(..) + 1`` keeps its low 32 bits (0) + 1."""
    if np.isfinite(inv):
        for j in range(x.shape[0]):
            v = np.float32(x[j] * inv)
            t[j] = 1 + np.int32(v >= np.float32(0.5)) - np.int32(v <= np.float32(-0.5))
    else:
        for j in range(x.shape[0]):
            t[j] = 1


@njit
def _pack5(t, first, stride, n, y, pos):
    """Bytes ``y[pos + m]`` (m < n) from the five trits ``t[first + m + stride * k]`` (k = 0..4, first
    most significant) as ggml's ceiling-scaled base-3 number."""
    for m in range(n):
        q = (((t[first + m] * 3 + t[first + m + stride]) * 3 + t[first + m + 2 * stride]) * 3
             + t[first + m + 3 * stride]) * 3 + t[first + m + 4 * stride]
        y[pos + m] = np.uint8((q * 256 + 242) // 243)


@njit
def quantize_block_tq1_0(x, y, pos, t):
    amax, inv = _absmax_inv(x)
    _trits(x, inv, t)
    _pack5(t, 0, 32, 32, y, pos + _TQ1_QS)
    _pack5(t, 160, 16, 16, y, pos + _TQ1_QS + 32)
    for j in range(4):  # four trits and a zero fifth
        q = (((t[240 + j] * 3 + t[244 + j]) * 3 + t[248 + j]) * 3 + t[252 + j]) * 3
        y[pos + _TQ1_QH + j] = np.uint8((q * 256 + 242) // 243)
    put_f16(y, pos + _TQ1_D, amax)


@njit
def quantize_block_tq2_0(x, y, pos, t):
    amax, inv = _absmax_inv(x)
    _trits(x, inv, t)
    for j in range(2):
        for m in range(32):
            o = 128 * j + m
            y[pos + _TQ2_QS + 32 * j + m] = np.uint8((t[o] & 3) | ((t[o + 32] & 3) << 2) | ((t[o + 64] & 3) << 4)
                                           | ((t[o + 96] & 3) << 6))
    put_f16(y, pos + _TQ2_D, amax)


@njit
def _t(b, p3):
    """Trit - 1 (float32 -1, 0 or 1) of weight ``p3`` = 3**k in TQ1_0 byte ``b`` (int32):
    ``((b * 3**k) mod 256) * 3 >> 8``."""
    return np.float32(((((b * p3) & 255) * 3) >> 8) - 1)


# The decoders write each byte's values with straight-line stores (TQ2_0: 1.3 -> 7.7 G values/s on one
# core, TQ1_0: 0.4 -> 2.6, against loops over the bit position; measured).
@njit
def dequantize_block_tq1_0(ss, yy):
    """ggml's ``dequantize_row_tq1_0`` for one block: its bytes ``ss`` -> 256 values ``yy``."""
    d = get_f16(ss, _TQ1_D)
    for m in range(32):
        b = np.int32(ss[_TQ1_QS + m])
        yy[m] = _t(b, 1) * d
        yy[32 + m] = _t(b, 3) * d
        yy[64 + m] = _t(b, 9) * d
        yy[96 + m] = _t(b, 27) * d
        yy[128 + m] = _t(b, 81) * d
    for m in range(16):
        b = np.int32(ss[_TQ1_QS + 32 + m])
        yy[160 + m] = _t(b, 1) * d
        yy[176 + m] = _t(b, 3) * d
        yy[192 + m] = _t(b, 9) * d
        yy[208 + m] = _t(b, 27) * d
        yy[224 + m] = _t(b, 81) * d
    for j in range(4):
        b = np.int32(ss[_TQ1_QH + j])
        yy[240 + j] = _t(b, 1) * d
        yy[244 + j] = _t(b, 3) * d
        yy[248 + j] = _t(b, 9) * d
        yy[252 + j] = _t(b, 27) * d


@njit
def dequantize_block_tq2_0(ss, yy):
    """ggml's ``dequantize_row_tq2_0`` for one block."""
    d = get_f16(ss, _TQ2_D)
    for j in range(2):
        for m in range(32):
            b = np.int32(ss[_TQ2_QS + 32 * j + m])
            yy[128 * j + m] = np.float32((b & 3) - 1) * d
            yy[128 * j + 32 + m] = np.float32(((b >> 2) & 3) - 1) * d
            yy[128 * j + 64 + m] = np.float32(((b >> 4) & 3) - 1) * d
            yy[128 * j + 96 + m] = np.float32((b >> 6) - 1) * d


def _quantize_row_body(x, y):
    """TQ1_0, or TQ2_0 (``TQ2``, bound per type by ``jit.specialize``), of a row."""
    t = np.empty(QK_K, dtype=np.int32)
    for ib in range(x.shape[0] // QK_K):
        xb = x[QK_K * ib:QK_K * (ib + 1)]
        if TQ2:  # noqa: F821
            quantize_block_tq2_0(xb, y, _TQ2_BYTES * ib, t)
        else:
            quantize_block_tq1_0(xb, y, _TQ1_BYTES * ib, t)


class TQ1_0(QuantType, qtype=T.TQ1_0):
    """54 bytes per 256 (module docstring): qs[48], qh[4], fp16 d."""
    uses_imatrix = False
    quantize_row_ref = build_kernel(_quantize_row_body, T.TQ1_0, False, TQ2=False)
    dequantize_block = dequantize_block_tq1_0


class TQ2_0(QuantType, qtype=T.TQ2_0):
    """66 bytes per 256: qs[64], fp16 d."""
    uses_imatrix = False
    quantize_row_ref = build_kernel(_quantize_row_body, T.TQ2_0, False, TQ2=True)
    dequantize_block = dequantize_block_tq2_0
