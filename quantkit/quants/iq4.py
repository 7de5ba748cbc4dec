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

The search runs on every 32-block of a row at once (``_search_lanes``: one lane per block, each lane's
sums in ggml's order; the table lookup is a branch-free count so the loops over lanes vectorize).

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
from quantkit.quants.common import absmax_lanes, get_f16, put_f16

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
def _best_index_counted(al):
    """``best_index_iq4nl`` for a finite ``al`` without branches: the level above ``al`` is the count of
    levels <= al (the table is strictly increasing), then the same tie rule; so it vectorizes over lanes."""
    kv = _KV_F32
    c = 0
    for m in range(16):
        c += 1 if kv[m] <= al else 0
    mu = min(max(c, 1), 15)
    idx = mu - 1 if al - kv[mu - 1] < kv[mu] - al else mu
    idx = 0 if al <= kv[0] else idx
    return 15 if al >= kv[15] else idx


@njit
def _fit_lanes(XT, WT, inv, sumqx, sumq2):
    """Every lane's weighted fit at inverse scale ``inv[k]``: sum w*q*x and sum w*q*q over its 32 values."""
    kv = _KV_F32
    n, nl = XT.shape
    for k in range(nl):
        sumqx[k] = np.float32(0.0)
        sumq2[k] = np.float32(0.0)
    for j in range(n):
        xj = XT[j]
        wj = WT[j]
        for k in range(nl):
            q = kv[_best_index_counted(inv[k] * xj[k])]
            w = wj[k]
            sumqx[k] += w * q * xj[k]
            sumq2[k] += w * q * q


@njit
def _search_lanes(XT, WT, d):
    """Best scale of every 32-value block of a row at once (block k's values and weights in column k
    of XT/WT); 0 for a negligible block. ggml's search per block (first scale on the block's signed
    extreme, then ``2 * ntry + 1`` trial inverse scales), every float sum in its order, so the scales equal
    a block-at-a-time search; the loops over blocks vectorize (each block's sums are a serial chain).
    Inverse scales stay finite here (|inv * x| <= ~127), which ``_best_index_counted`` needs."""
    kv = _KV_F32
    n, nl = XT.shape
    amax, mx = absmax_lanes(XT)
    inv = np.empty(nl, dtype=np.float32)
    sumqx = np.empty(nl, dtype=np.float32)
    sumq2 = np.empty(nl, dtype=np.float32)
    best = np.empty(nl, dtype=np.float32)
    for k in range(nl):
        inv[k] = np.float32(1.0) / (-mx[k] / kv[0])
    _fit_lanes(XT, WT, inv, sumqx, sumq2)
    for k in range(nl):
        d[k] = sumqx[k] / sumq2[k] if sumq2[k] > np.float32(0.0) else np.float32(0.0)
        best[k] = d[k] * sumqx[k]
    for itry in range(-_NTRY, _NTRY + 1):
        for k in range(nl):
            inv[k] = np.float32(itry - 127) / mx[k]  # (itry + first level) / max
        _fit_lanes(XT, WT, inv, sumqx, sumq2)
        for k in range(nl):
            b = sumq2[k] > np.float32(0.0) and sumqx[k] * sumqx[k] > best[k] * sumq2[k]
            dd = sumqx[k] / sumq2[k]
            d[k] = dd if b else d[k]
            best[k] = dd * sumqx[k] if b else best[k]
    for k in range(nl):
        d[k] = np.float32(0.0) if amax[k] < _GROUP_MAX_EPS else d[k]


@njit
def _row_search(x, qw, use_qw, super_size, scales):
    """The scales of every 32-block of a row (``quantize_row_iq4_nl_impl``'s search), weights from the
    ``super_size`` super-block each block belongs to."""
    nblock = x.shape[0] // 32
    XT = np.empty((32, nblock), dtype=np.float32)
    WT = np.empty((32, nblock), dtype=np.float32)
    for ib in range(nblock):
        for j in range(32):
            XT[j, ib] = x[32 * ib + j]
    per = super_size // 32
    for isb in range(nblock // per):
        sigma2 = _sigma2(x[super_size * isb:super_size * (isb + 1)])
        for ib in range(per * isb, per * isb + per):
            for j in range(32):
                v = XT[j, ib]
                WT[j, ib] = qw[32 * ib + j] * np.sqrt(sigma2 + v * v) if use_qw else v * v
    _search_lanes(XT, WT, scales)


@njit
def quantize_block_iq4_nl(x, d, y, pos, L):
    """One 32-element block ``x`` with its searched scale ``d`` -> 18 bytes at ``y[pos:]``."""
    put_f16(y, pos, d)
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    for j in range(32):
        L[j] = best_index_iq4nl(inv * x[j])
    _pack_nibbles(L, y, pos + 2, 32)


@njit
def quantize_superblock_iq4_xs(x, scales, y, pos, L):
    """One 256-element super-block ``x`` with its eight searched block scales -> 136 bytes at ``y[pos:]``."""
    max_scale = np.float32(0.0)
    amax_scale = np.float32(0.0)
    for ib in range(8):
        s = scales[ib]
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
        scales = np.empty(nblock, dtype=np.float32)
        _row_search(x[r], qw, use_qw, 32, scales)
        L = np.empty(32, dtype=np.uint8)
        for ib in range(nblock):
            quantize_block_iq4_nl(x[r, 32 * ib:32 * ib + 32], scales[ib], y[r], _NL_BYTES * ib, L)


@njit_parallel
def quantize_rows_iq4_xs(x, y, qw):
    use_qw = qw.shape[0] > 0
    nblock = x.shape[1] // 256
    for r in prange(x.shape[0]):
        scales = np.empty(8 * nblock, dtype=np.float32)
        _row_search(x[r], qw, use_qw, 256, scales)
        L = np.empty(256, dtype=np.uint8)
        for ib in range(nblock):
            quantize_superblock_iq4_xs(x[r, 256 * ib:256 * ib + 256], scales[8 * ib:8 * ib + 8], y[r],
                                       _XS_BYTES * ib, L)


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
