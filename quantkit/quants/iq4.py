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

from quantkit.formats import ggml_types
from quantkit.jit import ld_u16, njit
from quantkit.quants.base import QuantType, build_kernel
from quantkit.quants.common import (GROUP_MAX_EPS, absmax_lanes, absmax_signed, block_layout, ld_f16, nearest_int,
                                    pack_nibbles, put_f16, rt_len, sum_squares)

#: the 16 reconstruction levels shared by IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl; the type table's)
KVALUES_IQ4NL = np.array(ggml_types.KVALUES_IQ4NL, dtype=np.int8)
_KV_F32 = KVALUES_IQ4NL.astype(np.float32)

_NTRY = 7
_NL_BYTES, _NL_D, _NL_QS = block_layout("IQ4_NL", "d", "qs")
_XS_BYTES, _XS_D, _XS_SCALES_H, _XS_SCALES_L, _XS_QS = block_layout("IQ4_XS", "d", "scales_h", "scales_l", "qs")


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
    sumqx[:] = np.float32(0.0)
    sumq2[:] = np.float32(0.0)
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
        d[k] = np.float32(0.0) if amax[k] < GROUP_MAX_EPS else d[k]


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
        xs = x[super_size * isb:super_size * (isb + 1)]
        sigma2 = sum_squares(xs) * np.float32(np.float32(2.0) / np.float32(super_size))
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
    pack_nibbles(L, y, pos + 2, 32)


@njit
def quantize_superblock_iq4_xs(x, scales, y, pos, L):
    """One 256-element super-block ``x`` with its eight searched block scales -> 136 bytes at ``y[pos:]``."""
    max_scale, _ = absmax_signed(scales)
    d = -max_scale / np.float32(32.0)  # -0.0 for an all-negligible super-block, as in ggml
    put_f16(y, pos, d)
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    scales_h = np.uint32(0)
    for ib in range(8):
        l = nearest_int(inv * scales[ib])
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
    pack_nibbles(L, y, pos + 8, 256)


def _quantize_row_body(x, y, qw):
    """IQ4_NL (``SUPER`` 32) or IQ4_XS (256) of a row: every block's scale searched, then each
    super-block written. ``SUPER`` is bound per type (``jit.specialize``)."""
    super_size = SUPER  # noqa: F821
    scales = np.empty(x.shape[0] // 32, dtype=np.float32)
    _row_search(x, qw, qw.shape[0] > 0, super_size, scales)
    L = np.empty(super_size, dtype=np.uint8)
    per = super_size // 32
    for ib in range(x.shape[0] // super_size):
        xs = x[super_size * ib:super_size * (ib + 1)]
        if super_size == 32:
            quantize_block_iq4_nl(xs, scales[ib], y, _NL_BYTES * ib, L)
        else:
            quantize_superblock_iq4_xs(xs, scales[per * ib:per * (ib + 1)], y, _XS_BYTES * ib, L)


@njit(inline="always")
def _decode32(src, qs, d, y, at):
    """32 values ``y[at:at + 32]`` from the 16 bytes of table indices at ``src[qs:]`` (value j in the low
    nibble of byte j, value j + 16 in the high nibble) times the scale ``d``."""
    kv = _KV_F32
    n16 = rt_len(16)
    for j in range(n16):
        y[at + j] = d * kv[np.int32(src[qs + j]) & 15]
    for j in range(n16):
        y[at + j + 16] = d * kv[np.int32(src[qs + j]) >> 4]


@njit(inline="always")
def dequantize_block_iq4_nl(src, y):
    """ggml's ``dequantize_row_iq4_nl`` for one block (the codec's and the kernels' row decoder is built
    from it)."""
    _decode32(src, _NL_QS, ld_f16(src, _NL_D), y, 0)


class IQ4_NL(QuantType, qtype=T.IQ4_NL):
    """18 bytes per 32: fp16 d, qs[16] (4-bit indices into the table, as Q4_0's nibbles)."""
    quantize_row = build_kernel(_quantize_row_body, T.IQ4_NL, False, SUPER=32)
    dequantize_block = dequantize_block_iq4_nl


@njit
def _iq4_xs_scale(src, ib):
    """The signed 6-bit scale of block ``ib`` of an IQ4_XS super-block."""
    sh = ld_u16(src, _XS_SCALES_H)
    low = (np.int32(src[_XS_SCALES_L + ib // 2]) >> (4 * (ib % 2))) & 15
    high = np.int32((sh >> np.uint32(2 * ib)) & np.uint32(3))
    return (low | (high << 4)) - 32


@njit(inline="always")
def dequantize_block_iq4_xs(src, y):
    """ggml's ``dequantize_row_iq4_xs`` for one super-block."""
    d = ld_f16(src, _XS_D)
    for ib in range(8):
        _decode32(src, _XS_QS + 16 * ib, d * np.float32(_iq4_xs_scale(src, ib)), y, 32 * ib)


class IQ4_XS(QuantType, qtype=T.IQ4_XS):
    """136 bytes per 256: fp16 d, scales_h (uint16), scales_l[4], qs[128]."""
    quantize_row = build_kernel(_quantize_row_body, T.IQ4_XS, False, SUPER=256)
    dequantize_block = dequantize_block_iq4_xs
