"""The K-quants: 256-value super-blocks whose sub-block scales (and minima) are themselves quantized
against fp16 super-scales -- Q2_K, Q4_K, Q5_K (scale and minimum, ``x ~ d * q - m``), Q3_K, Q6_K (scale
only) and Q8_K (float32 scale, int8 quants, the activation type of the K-quants' dot products).

Bit-exact with ggml's ``src/ggml-quants.c``, per ``ggml_quantize_chunk``'s dispatch:

* no importance matrix: ``quantize_row_<type>_ref``;
* with one: ``quantize_row_<type>_impl`` -- weighted sub-block searches (quants/search.py) and, for the
  affine types, a weighted quantization of the sub-block scales and mins (``make_qp_quants``). Q8_K has
  no weighted variant (``uses_imatrix = False``);
* ``dequantize_row_<type>`` equals ggml's and gguf-py's ``dequantize``; the kernels decode rows with it too.

The sub-block searches of a row run as lanes (search.py's module docstring). Float32 in ggml's order
throughout, C's casts kept (quants/common.py), so even degenerate blocks give ggml's bytes.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit
from quantkit.quants.base import QuantType, build_kernel
from quantkit.quants.common import (GROUP_MAX_EPS, absmax_signed, block_layout, get_f16, get_f32, imatrix_weight,
                                    ld_f16, nearest_int, put_f16, put_f32, rt_len, sum_squares, wrap_i8)
from quantkit.quants.search import (clamp, lanes, make_q3_quants_lanes, make_qkx2_quants, make_qkx2_quants_lanes,
                                    make_qp_quants, make_qx_quants, make_qx_quants_lanes, untranspose)

F32 = np.float32
QK_K = 256

_Q2_K_TS, _Q2_K_SCALES, _Q2_K_QS, _Q2_K_D, _Q2_K_DMIN = block_layout("Q2_K", "scales", "qs", "d", "dmin")
_Q3_K_TS, _Q3_K_HMASK, _Q3_K_QS, _Q3_K_SCALES, _Q3_K_D = block_layout("Q3_K", "hmask", "qs", "scales", "d")
_Q4_K_TS, _Q4_K_D, _Q4_K_DMIN, _Q4_K_SCALES, _Q4_K_QS = block_layout("Q4_K", "d", "dmin", "scales", "qs")
_Q5_K_TS, _Q5_K_D, _Q5_K_DMIN, _Q5_K_SCALES, _Q5_K_QH, _Q5_K_QS = block_layout("Q5_K", "d", "dmin", "scales", "qh",
                                                                             "qs")
_Q6_K_TS, _Q6_K_QL, _Q6_K_QH, _Q6_K_SCALES, _Q6_K_D = block_layout("Q6_K", "ql", "qh", "scales", "d")


# ---------------------------------------------------------------------------------------------
# Q2_K: 16 sub-blocks of 16, 4-bit scale and 4-bit min per sub-block, 2-bit quants
#   bytes: scales[16] (scale | min << 4), qs[64], d (fp16), dmin (fp16)
# ---------------------------------------------------------------------------------------------

@njit
def _q2_k_super_ref(xb, yb, L, Laux, weights, scales, mins):
    q4scale = F32(15.0)
    max_scale = F32(0.0)
    max_min = F32(0.0)
    for j in range(16):
        xs = xb[16 * j:16 * j + 16]
        for l in range(16):
            weights[l] = abs(xs[l])
        sc, mn = make_qkx2_quants(3, xs, weights, L[16 * j:16 * j + 16], Laux, F32(-0.5), F32(0.1), 15, True)
        scales[j] = sc
        mins[j] = mn
        if sc > max_scale:
            max_scale = sc
        if mn > max_min:
            max_min = mn
    if max_scale > F32(0.0):
        iscale = q4scale / max_scale
        for j in range(16):
            yb[j] = np.uint8(nearest_int(iscale * scales[j]) & 0xFF)
        put_f16(yb, 80, max_scale / q4scale)
    else:
        for j in range(16):
            yb[j] = 0
        put_f16(yb, 80, F32(0.0))
    if max_min > F32(0.0):
        iscale = q4scale / max_min
        for j in range(16):
            yb[j] = np.uint8((np.int32(yb[j]) | (nearest_int(iscale * mins[j]) << 4)) & 0xFF)
        put_f16(yb, 82, max_min / q4scale)
    else:
        put_f16(yb, 82, F32(0.0))


@njit
def _q2_k_weights(xb, qwb, WT, sw, lane0):
    """The weighted Q2_K search's weights for one super-block: its 16 sub-blocks' are lanes ``lane0..+15``
    of WT (ggml's imatrix weights), and each sub-block's weight sum goes to ``sw``."""
    sigma2 = sum_squares(xb) / F32(QK_K)
    for j in range(16):
        s = F32(0.0)
        for l in range(16):
            w = imatrix_weight(qwb[16 * j + l], xb[16 * j + l], sigma2)
            s += w
            WT[l, lane0 + j] = w
        sw[j] = s


@njit
def _q2_k_super_impl(yb, L, LT, lane0, scales, mins, sw, Ls, Lm):
    """After the row's search (``make_qkx3_quants`` per sub-block, run as lanes): the levels, then the
    sub-block scales and mins quantized with ``make_qp_quants``."""
    untranspose(LT, lane0, L, 16)
    dm = make_qp_quants(15, scales, Ls, sw)
    mm = make_qp_quants(15, mins, Lm, sw)
    put_f16(yb, 80, dm)
    put_f16(yb, 82, mm)
    for j in range(16):
        yb[j] = np.uint8((Ls[j] | (Lm[j] << 4)) & 0xFF)


@njit
def _q2_k_requant_pack(xb, yb, L):
    """Re-round every value against the stored fp16 scales, then pack four 2-bit quants a byte."""
    d_all = get_f16(yb, 80)
    m_all = get_f16(yb, 82)
    for j in range(16):
        d = d_all * F32(yb[j] & 0xF)
        if d == F32(0.0):
            continue
        dm = m_all * F32(yb[j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = clamp(0, 3, nearest_int((xb[16 * j + ii] + dm) / d))
    for j in range(0, QK_K, 128):
        for l in range(32):
            yb[16 + j // 4 + l] = np.uint8(
                L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6))


@njit
def _quantize_row_q2_k(x, y, qw):
    nb = x.shape[0] // QK_K
    L = np.zeros(QK_K, dtype=np.uint8)
    Laux = np.zeros(16, dtype=np.uint8)
    weights = np.zeros(16, dtype=np.float32)
    scales = np.zeros(16, dtype=np.float32)
    mins = np.zeros(16, dtype=np.float32)
    sw = np.zeros(16, dtype=np.float32)
    Ls = np.zeros(16, dtype=np.int32)
    Lm = np.zeros(16, dtype=np.int32)
    weighted = qw.shape[0] > 0
    # weighted: every sub-block's make_qkx3_quants search of the row at once, one per lane
    # (make_qkx2_quants_lanes: bit-identical to the per-sub-block search, ~10x faster)
    XT, WT, LT, AT, row_scales = lanes(x[:x.shape[0] if weighted else 0], 16, np.uint8)
    row_mins = np.empty_like(row_scales)
    row_sw = np.empty_like(row_scales)
    if weighted:
        for i in range(nb):
            _q2_k_weights(x[i * QK_K:(i + 1) * QK_K], qw[i * QK_K:(i + 1) * QK_K], WT, row_sw[16 * i:16 * i + 16],
                          16 * i)
        make_qkx2_quants_lanes(3, XT, WT, LT, AT, F32(-0.9), F32(0.05), 36, False, row_scales, row_mins)
    for i in range(nb):
        xb = x[i * QK_K:(i + 1) * QK_K]
        yb = y[i * 84:(i + 1) * 84]
        if weighted:
            _q2_k_super_impl(yb, L, LT, 16 * i, row_scales[16 * i:16 * i + 16], row_mins[16 * i:16 * i + 16],
                             row_sw[16 * i:16 * i + 16], Ls, Lm)
        else:
            _q2_k_super_ref(xb, yb, L, Laux, weights, scales, mins)
        _q2_k_requant_pack(xb, yb, L)


@njit(inline="always")
def _plane2(g):
    """Where the 16 values of group ``g`` (0..15) of Q2_K's and Q3_K's 2-bit planes are: (byte offset in
    qs, bit shift, first value) -- 128 values per 32 bytes, four 2-bit planes a byte (ggml's n, j, l loops)."""
    n = g // 8
    j = (g // 2) % 4
    half = g % 2
    return 32 * n + 16 * half, 2 * j, 128 * n + 32 * j + 16 * half


@njit(inline="always")
def dequantize_block_q2_k(src, y):
    n16 = rt_len(16)
    d = ld_f16(src, _Q2_K_D)
    dmin = ld_f16(src, _Q2_K_DMIN)
    for g in range(16):
        q, shift, base = _plane2(g)
        sc = np.int32(src[_Q2_K_SCALES + g])
        dl = d * F32(sc & 15)
        ml = dmin * F32(sc >> 4)
        qs = src[_Q2_K_QS + q:_Q2_K_QS + q + 16]
        yy = y[base:base + 16]
        for l in range(n16):
            yy[l] = dl * F32((np.int32(qs[l]) >> shift) & 3) - ml


class Q2_K(QuantType, qtype=T.Q2_K):
    """84 bytes per 256: scales[16] (a 4-bit scale and a 4-bit min per 16 values), qs[64] (2-bit
    quants), fp16 d and dmin."""
    quantize_row = _quantize_row_q2_k
    dequantize_block = dequantize_block_q2_k


# ---------------------------------------------------------------------------------------------
# Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scale and 6-bit min per sub-block
#   bytes: d (fp16), dmin (fp16), scales[12] (get_scale_min_k4 packing), [qh[32] for Q5_K], qs[128]
# ---------------------------------------------------------------------------------------------

@njit
def _put_scale_min_k4(sc12, j, ls, lm):
    """Pack sub-block j's 6-bit scale ``ls`` and min ``lm`` into the 12 scale bytes.

    Sub-blocks 0-3 take the low 6 bits of bytes 0-7; 4-7 put their low nibbles in bytes 8-11 and their
    top 2 bits into bits 6-7 of bytes 0-7, so callers must go j = 0..7 in order (as ggml does).
    Values are stored with C's uint8 wrap-around."""
    if j < 4:
        sc12[j] = np.uint8(ls & 0xFF)
        sc12[j + 4] = np.uint8(lm & 0xFF)
    else:
        sc12[j + 4] = np.uint8(((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF)
        sc12[j - 4] = np.uint8((np.int32(sc12[j - 4]) | ((ls >> 4) << 6)) & 0xFF)
        sc12[j] = np.uint8((np.int32(sc12[j]) | ((lm >> 4) << 6)) & 0xFF)


@njit
def _get_scale_min_k4(j, sc12):
    if j < 4:
        return np.int32(sc12[j] & 63), np.int32(sc12[j + 4] & 63)
    d = np.int32((sc12[j + 4] & 0xF) | ((sc12[j - 4] >> 6) << 4))
    m = np.int32((sc12[j + 4] >> 4) | ((sc12[j] >> 6) << 4))
    return d, m


@njit
def _k32_scales_ref(yb, scales, mins):
    """quantize_row_q{4,5}_K_ref after the sub-block searches: 6-bit scales and mins against the largest."""
    max_scale = F32(0.0)
    max_min = F32(0.0)
    for j in range(8):
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = F32(63.0) / max_scale if max_scale > F32(0.0) else F32(0.0)
    inv_min = F32(63.0) / max_min if max_min > F32(0.0) else F32(0.0)
    sc12 = yb[4:16]
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        _put_scale_min_k4(sc12, j, ls, lm)
    put_f16(yb, 0, max_scale / F32(63.0))
    put_f16(yb, 2, max_min / F32(63.0))


@njit
def _k32_scales_impl(yb, clamp63, scales, mins, sw, Ls, Lm):
    """quantize_row_q{4,5}_K_impl after the sub-block searches: weighted 6-bit scales and mins."""
    d_block = make_qp_quants(63, scales, Ls, sw)
    m_block = make_qp_quants(63, mins, Lm, sw)
    sc12 = yb[4:16]
    for j in range(8):
        ls = Ls[j]
        lm = Lm[j]
        if clamp63:  # Q5_K clamps here, Q4_K does not
            ls = min(63, ls)
            lm = min(63, lm)
        _put_scale_min_k4(sc12, j, ls, lm)
    put_f16(yb, 0, d_block)
    put_f16(yb, 2, m_block)


@njit
def _k32_search(x, qw, nmax, XT, WT, LT, AT, scales, mins, sw):
    """Every 32-value sub-block's (scale, min) search of a row, all sub-blocks as lanes.

    Weights as ggml: ``av_x + |x|`` with av_x = rms of the sub-block (reference path), or
    ``qw * sqrt(sigma2 + x^2)`` with sigma2 = 2 * mean square of the super-block (imatrix path, which
    also returns the sub-blocks' weight sums in ``sw``)."""
    nsub = XT.shape[1]
    if qw.shape[0] > 0:
        for ib in range(nsub // 8):
            sigma2 = F32(2.0) * sum_squares(x[ib * QK_K:(ib + 1) * QK_K]) / F32(QK_K)
            for j in range(8 * ib, 8 * ib + 8):
                s = F32(0.0)
                for i in range(32):
                    w = imatrix_weight(qw[32 * j + i], x[32 * j + i], sigma2)
                    WT[i, j] = w
                    s += w
                sw[j] = s
        make_qkx2_quants_lanes(nmax, XT, WT, LT, AT, F32(-0.9), F32(0.05), 36, False, scales, mins)
    else:
        for j in range(nsub):
            av_x = np.sqrt(sum_squares(x[32 * j:32 * j + 32]) / F32(32.0))
            for i in range(32):
                WT[i, j] = av_x + abs(x[32 * j + i])
        if nmax == 15:
            make_qkx2_quants_lanes(15, XT, WT, LT, AT, F32(-1.0), F32(0.1), 20, False, scales, mins)
        else:
            make_qkx2_quants_lanes(31, XT, WT, LT, AT, F32(-0.5), F32(0.1), 15, False, scales, mins)


@njit
def _k32_requant(xb, yb, nmax, L):
    """Re-round every value against the stored fp16 d/dmin and 6-bit scales/mins."""
    d_all = get_f16(yb, 0)
    m_all = get_f16(yb, 2)
    sc12 = yb[4:16]
    for j in range(8):
        sc, m = _get_scale_min_k4(j, sc12)
        d = d_all * F32(sc)
        if d == F32(0.0):
            continue
        dm = m_all * F32(m)
        for ii in range(32):
            L[32 * j + ii] = clamp(0, nmax, nearest_int((xb[32 * j + ii] + dm) / d))


def _quantize_row_k32_body(x, y, qw):
    """A row of Q4_K (``NMAX`` 15) or Q5_K (31), blocks of ``TS`` bytes: the type's constants, bound per
    type (``jit.specialize``) so each build sees literals."""
    nmax = NMAX  # noqa: F821
    type_size = TS  # noqa: F821
    nb = x.shape[0] // QK_K
    XT, WT, LT, AT, scales = lanes(x, 32, np.uint8)  # the sub-blocks of 32 as lanes
    mins = np.empty_like(scales)
    sw = np.empty_like(scales)
    L = np.empty(QK_K, dtype=np.uint8)
    Ls = np.zeros(8, dtype=np.int32)
    Lm = np.zeros(8, dtype=np.int32)
    _k32_search(x, qw, nmax, XT, WT, LT, AT, scales, mins, sw)
    for i in range(nb):
        xb = x[i * QK_K:(i + 1) * QK_K]
        yb = y[i * type_size:(i + 1) * type_size]
        untranspose(LT, 8 * i, L, 32)
        if qw.shape[0] > 0:
            _k32_scales_impl(yb, nmax == 31, scales[8 * i:8 * i + 8], mins[8 * i:8 * i + 8], sw[8 * i:8 * i + 8],
                             Ls, Lm)
        else:
            _k32_scales_ref(yb, scales[8 * i:8 * i + 8], mins[8 * i:8 * i + 8])
        _k32_requant(xb, yb, nmax, L)
        if nmax == 15:
            for j in range(0, QK_K, 64):
                for l in range(32):
                    yb[16 + j // 2 + l] = np.uint8(L[j + l] | (L[j + l + 32] << 4))
        else:
            qh = yb[16:48]
            ql = yb[48:176]
            for l in range(32):
                qh[l] = 0
            for g in range(4):
                n = 64 * g
                m1 = np.uint8(1 << (2 * g))
                m2 = np.uint8(2 << (2 * g))
                for j in range(32):
                    l1 = np.int32(L[n + j])
                    if l1 > 15:
                        l1 -= 16
                        qh[j] |= m1
                    l2 = np.int32(L[n + j + 32])
                    if l2 > 15:
                        l2 -= 16
                        qh[j] |= m2
                    ql[32 * g + j] = np.uint8((l1 | (l2 << 4)) & 0xFF)


@njit
def _sub_scales_k4(d, dmin, sc12, j):
    """``d * scale`` and ``dmin * min`` of sub-blocks 2j and 2j+1 (get_scale_min_k4's packing)."""
    sc, mn = _get_scale_min_k4(2 * j, sc12)
    sc2, mn2 = _get_scale_min_k4(2 * j + 1, sc12)
    return d * F32(sc), dmin * F32(mn), d * F32(sc2), dmin * F32(mn2)


@njit(inline="always")
def dequantize_block_q4_k(src, y):
    n32 = rt_len(32)
    d = ld_f16(src, _Q4_K_D)
    dmin = ld_f16(src, _Q4_K_DMIN)
    sc12 = src[_Q4_K_SCALES:_Q4_K_SCALES + 12]
    for j in range(4):
        d1, m1, d2, m2 = _sub_scales_k4(d, dmin, sc12, j)
        q = src[_Q4_K_QS + 32 * j:_Q4_K_QS + 32 + 32 * j]
        yy = y[64 * j:64 * j + 64]
        for l in range(n32):
            yy[l] = d1 * F32(np.int32(q[l]) & 15) - m1
        for l in range(n32):
            yy[32 + l] = d2 * F32(np.int32(q[l]) >> 4) - m2


class Q4_K(QuantType, qtype=T.Q4_K):
    """144 bytes per 256: fp16 d and dmin, scales[12] (a 6-bit scale and min per 32 values,
    get_scale_min_k4 packing), qs[128] (4-bit quants)."""
    quantize_row = build_kernel(_quantize_row_k32_body, T.Q4_K, False, NMAX=15, TS=_Q4_K_TS)
    dequantize_block = dequantize_block_q4_k


@njit(inline="always")
def dequantize_block_q5_k(src, y):
    d = ld_f16(src, _Q5_K_D)
    dmin = ld_f16(src, _Q5_K_DMIN)
    sc12 = src[_Q5_K_SCALES:_Q5_K_SCALES + 12]
    qh = src[_Q5_K_QH:_Q5_K_QH + 32]
    for j in range(4):
        d1, m1, d2, m2 = _sub_scales_k4(d, dmin, sc12, j)
        q = src[_Q5_K_QS + 32 * j:_Q5_K_QS + 32 + 32 * j]
        yy = y[64 * j:64 * j + 64]
        for l in range(32):
            hb = ((np.int32(qh[l]) >> (2 * j)) & 1) << 4
            yy[l] = d1 * F32((np.int32(q[l]) & 15) + hb) - m1
        for l in range(32):
            hb = ((np.int32(qh[l]) >> (2 * j + 1)) & 1) << 4
            yy[32 + l] = d2 * F32((np.int32(q[l]) >> 4) + hb) - m2


class Q5_K(QuantType, qtype=T.Q5_K):
    """176 bytes per 256: as Q4_K, with qh[32] (the fifth bits) before qs[128]."""
    quantize_row = build_kernel(_quantize_row_k32_body, T.Q5_K, False, NMAX=31, TS=_Q5_K_TS)
    dequantize_block = dequantize_block_q5_k



# ---------------------------------------------------------------------------------------------
# Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales), fp16 d -- 110 bytes per 256 values
# ---------------------------------------------------------------------------------------------
@njit
def _q3_k_put_scale(sc, j, l):
    """Pack six-bit scale ``l`` (0..63) of sub-block ``j`` into the 12 scale bytes ``sc``."""
    if j < 8:
        sc[j] = np.uint8(l & 0xF)
    else:
        sc[j - 8] |= np.uint8((l & 0xF) << 4)
    sc[j % 4 + 8] |= np.uint8(((l >> 4) << (2 * (j // 4))) & 0xFF)


@njit
def _q3_k_get_scale(sc, j):
    """Signed scale of sub-block ``j`` (-32..31) from the 12 packed scale bytes."""
    lo = np.int32(sc[j]) & 0xF if j < 8 else np.int32(sc[j - 8]) >> 4
    hi = (np.int32(sc[8 + j % 4]) >> (2 * (j // 4))) & 3
    return (lo | (hi << 4)) - 32


@njit
def _q3_k_finish(x, y, o, L):
    """Requantize each sub-block with its stored scale, then write hmask and qs."""
    sc = y[o + 96:o + 108]
    dall = get_f16(y, o + 108)
    for j in range(QK_K // 16):
        d = dall * np.float32(_q3_k_get_scale(sc, j))
        if d == 0:
            continue
        for ii in range(16):
            l = nearest_int(x[16 * j + ii] / d)
            L[16 * j + ii] = max(-4, min(3, l)) + 4
    # hmask: bit b of byte m is the high bit of value 32*b + m (ggml's running m / hm), taken off L
    for m in range(QK_K // 8):
        byte = 0
        for b in range(8):
            hi = 1 if L[32 * b + m] > 3 else 0
            byte |= hi << b
            L[32 * b + m] -= 4 * hi
        y[o + m] = np.uint8(byte)
    for j in range(0, QK_K, 128):
        for l in range(32):
            v = (np.int32(L[j + l]) | (np.int32(L[j + l + 32]) << 2) | (np.int32(L[j + l + 64]) << 4)
                 | (np.int32(L[j + l + 96]) << 6))
            y[o + 32 + j // 4 + l] = np.uint8(v & 0xFF)


@njit
def q3_k_row_ref(x, y):
    XT, _, LT, _, sc = lanes(x, 16, np.int8)
    make_q3_quants_lanes(4, XT, LT, sc)
    L = np.empty(QK_K, dtype=np.int8)
    for ib in range(x.shape[0] // QK_K):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 110
        scales = sc[16 * ib:16 * ib + 16]
        untranspose(LT, 16 * ib, L, 16)
        max_scale, _ = absmax_signed(scales)
        for k in range(12):
            y[o + 96 + k] = 0
        if max_scale != 0:
            iscale = np.float32(np.float32(-32.0) / max_scale)
            sc12 = y[o + 96:o + 108]
            for j in range(QK_K // 16):
                l = wrap_i8(nearest_int(iscale * scales[j]))
                l = max(-32, min(31, l)) + 32
                _q3_k_put_scale(sc12, j, l)
            put_f16(y, o + 108, np.float32(np.float32(1.0) / iscale))
        else:
            put_f16(y, o + 108, np.float32(0.0))
        _q3_k_finish(xb, y, o, L)


@njit
def q3_k_row_impl(x, y, qw):
    nb = x.shape[0] // QK_K
    XT, WT, LT, AT, sc = lanes(x, 16, np.int8)
    sw = np.empty(XT.shape[1], dtype=np.float32)
    for ib in range(nb):
        sigma2 = np.float32(np.float32(2.0) * sum_squares(x[ib * QK_K:(ib + 1) * QK_K]) / np.float32(QK_K))
        for g in range(16 * ib, 16 * ib + 16):
            sumw = np.float32(0.0)
            for l in range(16):
                w = imatrix_weight(qw[16 * g + l], XT[l, g], sigma2)
                WT[l, g] = w
                sumw += w
            sw[g] = sumw
    make_qx_quants_lanes(4, XT, WT, LT, AT, sc)
    L = np.empty(QK_K, dtype=np.int8)
    Ls = np.empty(QK_K // 16, dtype=np.int8)
    for ib in range(nb):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 110
        untranspose(LT, 16 * ib, L, 16)
        for k in range(12):
            y[o + 96 + k] = 0
        d_block = make_qx_quants(QK_K // 16, 32, sc[16 * ib:16 * ib + 16], Ls, 1, sw[16 * ib:16 * ib + 16])
        sc12 = y[o + 96:o + 108]
        for j in range(QK_K // 16):
            _q3_k_put_scale(sc12, j, np.int32(Ls[j]))
        put_f16(y, o + 108, d_block)
        _q3_k_finish(xb, y, o, L)


@njit(inline="always")
def dequantize_block_q3_k(src, y):
    n16 = rt_len(16)
    d_all = ld_f16(src, _Q3_K_D)
    sc = src[_Q3_K_SCALES:_Q3_K_SCALES + 12]
    for g in range(16):
        q, shift, base = _plane2(g)
        dl = d_all * np.float32(_q3_k_get_scale(sc, g))
        m = 1 << (g // 2)  # the hmask bit of the group's plane
        qs = src[_Q3_K_QS + q:_Q3_K_QS + q + 16]
        hm = src[_Q3_K_HMASK + 16 * (g % 2):_Q3_K_HMASK + 16 * (g % 2) + 16]
        yy = y[base:base + 16]
        for l in range(n16):
            hv = 0 if (np.int32(hm[l]) & m) else 4
            yy[l] = dl * np.float32(((np.int32(qs[l]) >> shift) & 3) - hv)


class Q3_K(QuantType, qtype=T.Q3_K):
    """110 bytes per 256: hmask[32] (the third bits), qs[64] (the low two), scales[12] (16 six-bit
    signed scales), fp16 d."""
    quantize_row_ref = q3_k_row_ref
    quantize_row_impl = q3_k_row_impl
    dequantize_block = dequantize_block_q3_k



# ---------------------------------------------------------------------------------------------
# Q6_K: ql[128], qh[64], int8 scales[16], fp16 d -- 210 bytes per 256 values
# ---------------------------------------------------------------------------------------------
@njit
def q6_k_row(x, y, qw):
    """``quantize_row_q6_K_ref`` (empty qw) or ``quantize_row_q6_K_impl``; they differ only in
    the weights make_qx_quants gets."""
    nb = x.shape[0] // QK_K
    XT, WT, LT, AT, sc = lanes(x, 16, np.int8)
    weighted = qw.shape[0] > 0
    for i in range(16):
        for g in range(XT.shape[1]):
            WT[i, g] = qw[16 * g + i] if weighted else XT[i, g] * XT[i, g]  # rmse_type 1 without weights
    make_qx_quants_lanes(32, XT, WT, LT, AT, sc)
    L = np.empty(QK_K, dtype=np.int8)
    for ib in range(nb):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 210
        scales = sc[16 * ib:16 * ib + 16]
        untranspose(LT, 16 * ib, L, 16)
        max_scale, max_abs_scale = absmax_signed(scales)
        if max_abs_scale < GROUP_MAX_EPS:
            for k in range(210):
                y[o + k] = 0
            continue
        iscale = np.float32(np.float32(-128.0) / max_scale)
        put_f16(y, o + 208, np.float32(np.float32(1.0) / iscale))
        for j in range(QK_K // 16):
            y[o + 192 + j] = np.uint8(min(127, nearest_int(iscale * scales[j])) & 0xFF)
        dall = get_f16(y, o + 208)
        for j in range(QK_K // 16):
            d = dall * np.float32(wrap_i8(y[o + 192 + j]))
            if d == 0:
                continue
            for ii in range(16):
                l = nearest_int(xb[16 * j + ii] / d)
                L[16 * j + ii] = max(-32, min(31, l)) + 32
        for j in range(0, QK_K, 128):
            ql = o + j // 2
            qh = o + 128 + j // 4
            for l in range(32):
                q1 = np.int32(L[j + l]) & 0xF
                q2 = np.int32(L[j + l + 32]) & 0xF
                q3 = np.int32(L[j + l + 64]) & 0xF
                q4 = np.int32(L[j + l + 96]) & 0xF
                y[ql + l] = np.uint8(q1 | (q3 << 4))
                y[ql + l + 32] = np.uint8(q2 | (q4 << 4))
                h = ((np.int32(L[j + l]) >> 4) | ((np.int32(L[j + l + 32]) >> 4) << 2)
                     | ((np.int32(L[j + l + 64]) >> 4) << 4) | ((np.int32(L[j + l + 96]) >> 4) << 6))
                y[qh + l] = np.uint8(h & 0xFF)


@njit(inline="always")
def dequantize_block_q6_k(src, y):
    d = ld_f16(src, _Q6_K_D)
    for n in range(2):
        ql = src[_Q6_K_QL + 64 * n:_Q6_K_QL + 64 * n + 64]
        qh = src[_Q6_K_QH + 32 * n:_Q6_K_QH + 32 * n + 32]
        sc = _Q6_K_SCALES + 8 * n
        yy = y[128 * n:128 * n + 128]
        for half in range(2):  # is = l // 16
            s1 = d * np.float32(np.int8(src[sc + half]))
            s2 = d * np.float32(np.int8(src[sc + half + 2]))
            s3 = d * np.float32(np.int8(src[sc + half + 4]))
            s4 = d * np.float32(np.int8(src[sc + half + 6]))
            for i in range(16):
                l = 16 * half + i
                a = np.int32(ql[l])
                c = np.int32(ql[l + 32])
                h = np.int32(qh[l])
                yy[l] = s1 * np.float32(((a & 15) | ((h & 3) << 4)) - 32)
                yy[l + 32] = s2 * np.float32(((c & 15) | (((h >> 2) & 3) << 4)) - 32)
                yy[l + 64] = s3 * np.float32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                yy[l + 96] = s4 * np.float32(((c >> 4) | (((h >> 6) & 3) << 4)) - 32)


class Q6_K(QuantType, qtype=T.Q6_K):
    """210 bytes per 256: ql[128] (low four bits), qh[64] (high two), int8 scales[16], fp16 d."""
    quantize_row = q6_k_row
    dequantize_block = dequantize_block_q6_k


# ---------------------------------------------------------------------------------------------
# Q8_K: float32 d, int8 qs[256], int16 bsums[16] -- 292 bytes per 256 values
# ---------------------------------------------------------------------------------------------
@njit
def q8_k_row_ref(x, y):
    """``quantize_row_q8_K_ref``. ggml leaves ``bsums`` of an all-zero block unwritten; here they
    are 0 (the sum of its zero quants)."""
    for ib in range(x.shape[0] // QK_K):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 292
        fmax, amax = absmax_signed(xb)
        if amax == 0:
            for k in range(292):
                y[o + k] = 0
            continue
        iscale = np.float32(np.float32(-127.0) / fmax)
        for j in range(QK_K):
            v = nearest_int(iscale * xb[j])
            y[o + 4 + j] = np.uint8(min(127, v) & 0xFF)
        for j in range(QK_K // 16):
            s = 0
            for ii in range(16):
                s += wrap_i8(y[o + 4 + 16 * j + ii])
            y[o + 260 + 2 * j] = np.uint8(s & 0xFF)
            y[o + 261 + 2 * j] = np.uint8((s >> 8) & 0xFF)
        put_f32(y, o, np.float32(np.float32(1.0) / iscale))


@njit(inline="always")
def dequantize_block_q8_k(src, y):
    d = get_f32(src, 0)
    for j in range(QK_K):
        y[j] = d * np.float32(wrap_i8(src[4 + j]))


class Q8_K(QuantType, qtype=T.Q8_K):
    """292 bytes per 256: float32 d, int8 qs[256], int16 bsums[16] (the sums of 16 quants each)."""
    uses_imatrix = False  # quantize_row_q8_K_ref has no weighted variant
    quantize_row_ref = q8_k_row_ref
    dequantize_block = dequantize_block_q8_k
