"""IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table of 16 int8 levels.

Both types share one search (ggml's ``quantize_row_iq4_nl_impl``), run per 32-element block:

* every element gets a weight: ``x**2`` without an imatrix, ``qw * sqrt(sigma2 + x**2)`` with one,
  where ``sigma2`` is twice the mean square of the super-block;
* a first scale maps the block's signed extreme onto the table's first level (-127); the weighted
  least-squares scale of that assignment is the baseline, then 15 more inverse scales
  ``(k - 127) / max`` for k in -7..7 are tried and the one with the best ``sumqx**2 / sumq2`` wins;
* IQ4_NL (one 32-block per super-block) stores that scale as fp16 and re-picks the indices with it;
* IQ4_XS (eight 32-blocks per 256) stores one fp16 super-scale ``-max_scale/32`` and a 6-bit signed
  scale per block (low 4 bits in ``scales_l``, high 2 bits in ``scales_h``), then re-picks every
  index with the quantized block scale.

``ggml_quantize_chunk`` calls ``quantize_iq4_nl`` / ``quantize_iq4_xs`` for both types, which always
search with ``ntry = 7`` (the ``ntry = -1`` variant is only used by ggml's unused row-ref entry point),
so an absent imatrix only changes the weights. Bytes are identical to ggml; dequantization is
bit-exact with ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import f32_to_bits, njit, njit_parallel, prange
from quantkit.quants.base import QuantType
from quantkit.quants.common import get_f16, put_f16

#: the 16 reconstruction levels shared by IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.int8)
_KV_F32 = KVALUES_IQ4NL.astype(np.float32)

_NTRY = 7
_GROUP_MAX_EPS = np.float32(1e-15)
_NL_BYTES = 18    # fp16 d + 16 bytes of nibbles
_XS_BYTES = 136   # fp16 d + uint16 scales_h + 4 bytes scales_l + 128 bytes of nibbles


@njit
def best_index_iq4nl(x):
    """Index of the table level nearest to float32 ``x`` (bisection; ties go to the upper level
    only when strictly closer to it, exactly as ggml's ``best_index_int8``)."""
    kv = _KV_F32
    if x <= kv[0]:
        return 0
    if x >= kv[15]:
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < kv[mav]:
            mu = mav
        else:
            ml = mav
    if x - kv[mu - 1] < kv[mu] - x:
        return mu - 1
    return mu


@njit
def _nearest_int_magic(fval):
    """ggml's ``nearest_int`` bit trick, reproduced for every input (also inf/NaN, which
    ``np.rint`` followed by an int cast would not map the same way)."""
    v = np.float32(np.float32(fval) + np.float32(12582912.0))
    return np.int32(f32_to_bits(v) & np.uint32(0x007FFFFF)) - np.int32(0x00400000)


@njit
def _search_block(xb, weight):
    """Best scale for one 32-element block (weights already filled); 0 for a negligible block."""
    kv = _KV_F32
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(32):
        ax = np.abs(xb[j])
        if ax > amax:
            amax = ax
            mx = xb[j]
    if amax < _GROUP_MAX_EPS:
        return np.float32(0.0)
    d = -mx / kv[0]
    inv = np.float32(1.0) / d
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        q = kv[best_index_iq4nl(inv * xb[j])]
        w = weight[j]
        sumqx += w * q * xb[j]
        sumq2 += w * q * q
    d = sumqx / sumq2 if sumq2 > np.float32(0.0) else np.float32(0.0)
    best = d * sumqx
    for itry in range(-_NTRY, _NTRY + 1):
        inv = np.float32(itry - 127) / mx  # (itry + first level) / max
        sumqx = np.float32(0.0)
        sumq2 = np.float32(0.0)
        for j in range(32):
            q = kv[best_index_iq4nl(inv * xb[j])]
            w = weight[j]
            sumqx += w * q * xb[j]
            sumq2 += w * q * q
        if sumq2 > np.float32(0.0) and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit
def _fill_weights(xb, qwb, use_qw, sigma2, weight):
    if use_qw:
        for j in range(32):
            weight[j] = qwb[j] * np.sqrt(sigma2 + xb[j] * xb[j])
    else:
        for j in range(32):
            weight[j] = xb[j] * xb[j]


@njit
def _sigma2(x):
    s = np.float32(0.0)
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s * np.float32(np.float32(2.0) / np.float32(x.shape[0]))


@njit
def _pack_nibbles(L, y, pos, n):
    """Element j of each 32-group in the low nibble of byte j, element j+16 in the high nibble."""
    for i in range(n // 32):
        for j in range(16):
            y[pos + 16 * i + j] = np.uint8(L[32 * i + j] | (L[32 * i + 16 + j] << 4))


@njit
def quantize_block_iq4_nl(x, qw, use_qw, y, pos, weight, L):
    """One 32-element block ``x`` -> 18 bytes at ``y[pos:]``."""
    sigma2 = _sigma2(x)
    _fill_weights(x, qw, use_qw, sigma2, weight)
    d = _search_block(x, weight)
    put_f16(y, pos, d)
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    for j in range(32):
        L[j] = best_index_iq4nl(inv * x[j])
    _pack_nibbles(L, y, pos + 2, 32)


@njit
def quantize_superblock_iq4_xs(x, qw, use_qw, y, pos, weight, L, scales):
    """One 256-element super-block ``x`` -> 136 bytes at ``y[pos:]``."""
    sigma2 = _sigma2(x)
    max_scale = np.float32(0.0)
    amax_scale = np.float32(0.0)
    for ib in range(8):
        xb = x[32 * ib:32 * ib + 32]
        _fill_weights(xb, qw[32 * ib:32 * ib + 32] if use_qw else qw, use_qw, sigma2, weight)
        s = _search_block(xb, weight)
        scales[ib] = s
        if np.abs(s) > amax_scale:
            amax_scale = np.abs(s)
            max_scale = s
    d = -max_scale / np.float32(32.0)  # -0.0 for an all-negligible super-block, as in ggml
    put_f16(y, pos, d)
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    scales_h = np.uint32(0)
    for ib in range(8):
        l = _nearest_int_magic(inv * scales[ib])
        l = max(-32, min(31, l))
        dl = d * np.float32(l)
        idl = np.float32(1.0) / dl if dl != np.float32(0.0) else np.float32(0.0)
        for j in range(32):
            L[32 * ib + j] = best_index_iq4nl(idl * x[32 * ib + j])
        l += 32
        lo = np.uint8(l & 0xF)
        if ib % 2 == 0:
            y[pos + 4 + ib // 2] = lo
        else:
            y[pos + 4 + ib // 2] |= np.uint8(lo << 4)
        scales_h |= np.uint32((l >> 4) & 3) << np.uint32(2 * ib)
    y[pos + 2] = np.uint8(scales_h & np.uint32(0xFF))
    y[pos + 3] = np.uint8(scales_h >> np.uint32(8))
    _pack_nibbles(L, y, pos + 8, 256)


@njit_parallel
def quantize_rows_iq4_nl(x, y, qw):
    use_qw = qw.shape[0] > 0
    nblock = x.shape[1] // 32
    for r in prange(x.shape[0]):
        weight = np.empty(32, dtype=np.float32)
        L = np.empty(32, dtype=np.uint8)
        for ib in range(nblock):
            qwb = qw[32 * ib:32 * ib + 32] if use_qw else qw
            quantize_block_iq4_nl(x[r, 32 * ib:32 * ib + 32], qwb, use_qw, y[r], _NL_BYTES * ib, weight, L)


@njit_parallel
def quantize_rows_iq4_xs(x, y, qw):
    use_qw = qw.shape[0] > 0
    nblock = x.shape[1] // 256
    for r in prange(x.shape[0]):
        weight = np.empty(32, dtype=np.float32)
        L = np.empty(256, dtype=np.uint8)
        scales = np.empty(8, dtype=np.float32)
        for ib in range(nblock):
            qwb = qw[256 * ib:256 * ib + 256] if use_qw else qw
            quantize_superblock_iq4_xs(x[r, 256 * ib:256 * ib + 256], qwb, use_qw, y[r], _XS_BYTES * ib,
                                       weight, L, scales)


@njit_parallel
def dequantize_rows_iq4_nl(y, x):
    kv = _KV_F32
    nblock = x.shape[1] // 32
    for r in prange(y.shape[0]):
        src = y[r]
        out = x[r]
        for ib in range(nblock):
            p = _NL_BYTES * ib
            d = get_f16(src, p)
            for j in range(16):
                b = src[p + 2 + j]
                out[32 * ib + j] = d * kv[b & 0xF]
                out[32 * ib + 16 + j] = d * kv[b >> 4]


@njit_parallel
def dequantize_rows_iq4_xs(y, x):
    kv = _KV_F32
    nblock = x.shape[1] // 256
    for r in prange(y.shape[0]):
        src = y[r]
        out = x[r]
        for ibl in range(nblock):
            p = _XS_BYTES * ibl
            d = get_f16(src, p)
            scales_h = np.int32(src[p + 2]) | (np.int32(src[p + 3]) << 8)
            for ib in range(8):
                ls = ((np.int32(src[p + 4 + ib // 2]) >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)
                dl = d * np.float32(ls - 32)
                q = p + 8 + 16 * ib
                o = 256 * ibl + 32 * ib
                for j in range(16):
                    b = src[q + j]
                    out[o + j] = dl * kv[b & 0xF]
                    out[o + 16 + j] = dl * kv[b >> 4]


class IQ4_NL(QuantType, qtype=T.IQ4_NL):
    scale_fields = (0,)
    quantize_rows = quantize_rows_iq4_nl
    dequantize_rows = dequantize_rows_iq4_nl


class IQ4_XS(QuantType, qtype=T.IQ4_XS):
    scale_fields = (0,)
    quantize_rows = quantize_rows_iq4_xs
    dequantize_rows = dequantize_rows_iq4_xs
