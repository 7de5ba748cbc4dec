"""IQ1_S and IQ1_M: 8 values at a time snapped to one of 2048 ternary grid points, plus a shift.

A grid point (``quants/grids.py``) has 8 coordinates in -1, 0, 1; a value decodes as
``dl * (g + delta)`` with ``delta = +-1/8`` chosen per block (IQ1_S, per 32 values) or per group of 8
(IQ1_M, one bit per 8 values):

* IQ1_S (50 bytes per 256): fp16 ``d``; 32 low index bytes; per 32 values a uint16 with the four
  3-bit high index parts, a 3-bit scale ``s`` (``dl = d * (2s + 1)``) and the sign of ``delta`` (bit 15);
* IQ1_M (56 bytes per 256): 32 low index bytes; per 16 values a byte with two 3-bit high index parts
  and two ``delta`` signs (bits 3 and 7); four uint16 of 3-bit scales per 16 values whose top nibbles
  together hold the fp16 super-scale.

The quantizers follow ggml's ``quantize_row_iq1_s_impl`` / ``quantize_row_iq1_m_impl``
(ggml-quants.c): per block, the values sorted (a stable sort, as glibc's ``qsort`` merge sort) and
every split into three groups (-1, 0, +1) tried with both shifts; then each group of 8 looked up on
the grid, and an off-grid one replaced by its nearest neighbour (``quants/lattice.py``, the tables IQ1_S
and IQ1_M share); IQ1_M finally refits its super-scale over the whole super-block. ``ggml_quantize_chunk``
refuses IQ1_S without an importance matrix; IQ1_M without one weighs each value by ``x^2``. Float32
in ggml's order throughout, so the bytes are identical; dequantization is bit-exact with
``dequantize_row_iq1_{s,m}`` and ``gguf.quants``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit
from quantkit.quants.base import QuantType
from quantkit.quants.common import (absmax_signed, block_layout, fp16_to_fp32, fp32_to_fp16, get_f16, imatrix_weight,
                                    max_of, odd_scale_level, put_f16, sum_squares)
from quantkit.quants.lattice import best_neighbour, dequant_grid, quantizer

F32 = np.float32
QK_K = 256
DELTA = F32(0.125)  # IQ1S_DELTA == IQ1M_DELTA (ggml-common.h)
_GROUP_MAX_EPS_IQ1_S = F32(1e-12)
_GROUP_MAX_EPS_IQ1_M = F32(1e-7)
_FLT_MAX = F32(3.4028234663852886e38)
# block sizes and field offsets, from the type table (formats/ggml_types.py)
_, _S_QS, _S_QH = block_layout("IQ1_S", "qs", "qh")
_, _M_QS, _M_QH, _M_SC = block_layout("IQ1_M", "qs", "qh", "scales")
#: the grid as the dequantizers read it (values -1, 0, 1), float32 [2048, 8]
_GRID = dequant_grid(T.IQ1_S)
_X_P = np.array([-1.0 + 0.125, 0.125, 1.0 + 0.125], dtype=F32)  # levels with delta = +1/8
_X_M = np.array([-1.0 - 0.125, -0.125, 1.0 - 0.125], dtype=F32)  # and with delta = -1/8


@njit
def _stable_order(xb, idx):
    """``idx`` = the positions of ``xb`` by ascending value, equal values in position order."""
    n = xb.shape[0]
    for j in range(n):
        m = j - 1
        v = xb[j]
        while m >= 0 and xb[idx[m]] > v:
            idx[m + 1] = idx[m]
            m -= 1
        idx[m + 1] = j


@njit
def _weights(xb, qw, use_qw, sigma2, weight):
    for i in range(xb.shape[0]):
        weight[i] = imatrix_weight(qw[i], xb[i], sigma2) if use_qw else xb[i] * xb[i]


@njit
def _block_start(xb, qw, use_qw, sigma2, weight, idx, eps):
    """A block's weights, and, unless its largest magnitude is below ``eps`` (then False: all zeros), the
    order of its values (``_stable_order``)."""
    _weights(xb, qw, use_qw, sigma2, weight)
    if absmax_signed(xb)[1] < eps:
        return False
    _stable_order(xb, idx)
    return True


@njit
def _assign(idx, i1, i2, scale, L):
    """Levels 0 / 1 / 2 by sorted position (below ``i1``, below ``i2``, the rest); mirrored when the
    scale came out negative. Returns (scale >= 0, whether mirrored)."""
    n = idx.shape[0]
    for j in range(n):
        L[idx[j]] = 0 if j < i1 else (1 if j < i2 else 2)
    if scale < F32(0.0):
        for j in range(n):
            L[j] = 2 - L[j]
        return -scale, True
    return scale, False


@njit
def _snap(xb, weight, L, k, scale, xx, grid, kmap, neighbours):
    """Group ``k``'s grid index: its levels' own point, or the best neighbour when that is off the grid
    (then ``L`` takes the neighbour's levels). Returns (index, on the grid)."""
    u = 0
    for j in range(8):
        u |= L[8 * k + j] << (2 * j)
    e = kmap[u]
    if e >= 0:
        return e, True
    return best_neighbour(e, neighbours, grid, xb, weight, 8 * k, scale, xx, L), False


@njit
def _snap_all(xb, weight, L, index, ngroup, scale, xx0, xx1, grid, kmap, neighbours):
    """Every group's grid index into ``index`` (group 0 with levels ``xx0``, the rest ``xx1``); when one
    was off the grid, the scale refitted over the groups' points. Returns the scale."""
    all_on = True
    for k in range(ngroup):
        index[k], on = _snap(xb, weight, L, k, scale, xx0 if k == 0 else xx1, grid, kmap, neighbours)
        all_on = all_on and on
    if not all_on:
        sumqx, sumq2 = _refit(xb, weight, index, ngroup, grid, xx0, xx1)
        if sumqx > F32(0.0) and sumq2 > F32(0.0):
            scale = sumqx / sumq2
    return scale


@njit
def _refit(xb, weight, index, ngroup, grid, xx0, xx1):
    """sum w*q*x and sum w*q*q over the groups' grid points, group 0 with levels ``xx0``, the rest ``xx1``."""
    sumqx = F32(0.0)
    sumq2 = F32(0.0)
    for k in range(ngroup):
        xx = xx0 if k == 0 else xx1
        for j in range(8):
            w = weight[8 * k + j]
            q = xx[(np.int32(grid[index[k], j]) - 1) // 2]
            sumqx += w * q * xb[8 * k + j]
            sumq2 += w * q * q
    return sumqx, sumq2


# ---------------------------------------------------------------------------------------------
# IQ1_S: blocks of 32, one shift per block
# ---------------------------------------------------------------------------------------------

@njit
def _split_search_s(xb, weight, idx, sumx, sumw):
    """Every (i1, i2) split of the sorted block into -1 / 0 / +1 with both shifts: (best i1, i2,
    shift, scale), i1 = -1 when nothing fits."""
    n = xb.shape[0]
    sumx[0] = F32(0.0)
    sumw[0] = F32(0.0)
    for j in range(n):
        i = idx[j]
        sumx[j + 1] = sumx[j] + weight[i] * xb[i]
        sumw[j + 1] = sumw[j] + weight[i]
    best = -_FLT_MAX
    scale = absmax_signed(xb)[1]
    b1 = -1
    b2 = -1
    shift = 0
    for i1 in range(n + 1):
        for i2 in range(i1, n + 1):
            a = sumx[i1] - sumx[0]
            b = sumx[i2] - sumx[i1]
            c = sumx[n] - sumx[i2]
            wa = sumw[i1] - sumw[0]
            wb = sumw[i2] - sumw[i1]
            wc = sumw[n] - sumw[i2]
            for sgn in range(2):
                xx = _X_P if sgn == 0 else _X_M
                sumqx = a * xx[0] + b * xx[1] + c * xx[2]
                sumq2 = wa * xx[0] * xx[0] + wb * xx[1] * xx[1] + wc * xx[2] * xx[2]
                if sumq2 > F32(0.0) and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    b1 = i1
                    b2 = i2
                    shift = 1 if sgn == 0 else -1
    return b1, b2, shift, scale


@njit
def _superblock_iq1_s(xbl, qw, use_qw, grid, kmap, neighbours, y, w):
    weight, L, idx, sumx, sumw, index, scales, shifts = w
    y[:] = 0
    sigma2 = F32(2.0) * sum_squares(xbl) / F32(QK_K)
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        scales[ib] = F32(0.0)
        shifts[ib] = 1
        if not _block_start(xb, qw[32 * ib:32 * ib + 32], use_qw, sigma2, weight, idx, _GROUP_MAX_EPS_IQ1_S):
            continue
        i1, i2, shift, scale = _split_search_s(xb, weight, idx, sumx, sumw)
        if i1 < 0 or i2 < 0 or shift == 0:
            continue
        scale, mirrored = _assign(idx, i1, i2, scale, L)
        if mirrored:
            shift = -shift
        xx = _X_P if shift == 1 else _X_M
        scale = _snap_all(xb, weight, L, index, 4, scale, xx, xx, grid, kmap, neighbours)
        h = 0
        for k in range(4):
            y[_S_QS + 4 * ib + k] = np.uint8(index[k] & 255)
            h |= (index[k] >> 8) << (3 * k)
        y[_S_QH + 2 * ib] = np.uint8(h & 0xFF)
        y[_S_QH + 1 + 2 * ib] = np.uint8(h >> 8)
        scales[ib] = scale
        shifts[ib] = shift
    max_scale = max_of(scales)  # the skipped blocks' scales are 0, the others' positive
    if max_scale == F32(0.0):
        return
    d = max_scale / F32(15.0)
    put_f16(y, 0, d * F32(1.125))
    inv = F32(1.0) / d
    for ib in range(8):
        l = odd_scale_level(inv, scales[ib], 7)
        if shifts[ib] == -1:
            l |= 8
        y[_S_QH + 1 + 2 * ib] |= np.uint8(l << 4)


@njit
def _work(n, nblock):
    """Per-thread work arrays: weight, L, idx, sumx, sumw, index, scales, shifts."""
    return (np.empty(n, dtype=F32), np.zeros(n, dtype=np.int32), np.empty(n, dtype=np.int32),
            np.empty(n + 1, dtype=F32), np.empty(n + 1, dtype=F32), np.zeros(n // 8, dtype=np.int32),
            np.zeros(nblock, dtype=F32), np.zeros(nblock, dtype=np.int32))


@njit
def _work_s():
    return _work(32, 8)


# ---------------------------------------------------------------------------------------------
# IQ1_M: blocks of 16, one shift per group of 8
# ---------------------------------------------------------------------------------------------

@njit
def _split_search_m(xb, weight, idx, px, pw):
    """ggml's IQ1_M split search: prefix sums per half block (each half has its own shift), every
    (i1, i2) with the four shift pairs k (0: +,+  1: +,-  2: -,+  3: -,-). Returns (i1, i2, k, scale)."""
    n = xb.shape[0]
    half = n // 2
    px[0, 0] = F32(0.0)
    px[1, 0] = F32(0.0)
    pw[0, 0] = F32(0.0)
    pw[1, 0] = F32(0.0)
    for j in range(n):
        i = idx[j]
        h = 0 if i < half else 1
        px[h, j + 1] = px[h, j] + weight[i] * xb[i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[h, j + 1] = pw[h, j] + weight[i]
        pw[1 - h, j + 1] = pw[1 - h, j]
    p2 = _X_P[2]
    m2 = _X_M[2]
    cp1 = _X_P[0] * _X_P[0] - _X_P[1] * _X_P[1]
    cp2 = _X_P[1] * _X_P[1] - _X_P[2] * _X_P[2]
    cm1 = _X_M[0] * _X_M[0] - _X_M[1] * _X_M[1]
    cm2 = _X_M[1] * _X_M[1] - _X_M[2] * _X_M[2]
    best = -_FLT_MAX
    scale = absmax_signed(xb)[1]
    b1 = -1
    b2 = -1
    bk = -1
    for i1 in range(n + 1):
        for i2 in range(i1, n + 1):
            sx0 = px[0, i1] + px[0, i2]
            sx1 = px[1, i1] + px[1, i2]
            qxp0 = px[0, n] * p2 - sx0
            qxm0 = px[0, n] * m2 - sx0
            qxp1 = px[1, n] * p2 - sx1
            qxm1 = px[1, n] * m2 - sx1
            q2p0 = pw[0, n] * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
            q2m0 = pw[0, n] * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
            q2p1 = pw[1, n] * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
            q2m1 = pw[1, n] * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
            for k in range(4):  # the shift pairs in ggml's order
                sqx = (qxp0 if k < 2 else qxm0) + (qxp1 if k % 2 == 0 else qxm1)
                sq2 = (q2p0 if k < 2 else q2m0) + (q2p1 if k % 2 == 0 else q2m1)
                if sq2 > F32(0.0) and sqx * sqx > best * sq2:
                    scale = sqx / sq2
                    best = scale * sqx
                    b1 = i1
                    b2 = i2
                    bk = k
    return b1, b2, bk, scale


@njit
def _levels_m(k):
    """The (first group, second group) level tables of shift pair ``k``."""
    return (_X_P if k < 2 else _X_M), (_X_P if k % 2 == 0 else _X_M)


@njit
def _superblock_iq1_m(xbl, qw, use_qw, grid, kmap, neighbours, y, work):
    w, px, pw, blk_index = work
    weight, L, idx, _, _, index, scales, shifts = w
    y[:] = 0
    sigma2 = F32(2.0) * sum_squares(xbl) / F32(QK_K)
    blk_index[:] = 0
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        scales[ib] = F32(0.0)
        shifts[ib] = 0
        if not _block_start(xb, qw[16 * ib:16 * ib + 16] if use_qw else qw, use_qw, sigma2, weight, idx,
                            _GROUP_MAX_EPS_IQ1_M):
            continue
        i1, i2, bk, scale = _split_search_m(xb, weight, idx, px, pw)
        if i1 < 0 or i2 < 0 or bk < 0:
            continue
        scale, mirrored = _assign(idx, i1, i2, scale, L)
        if mirrored:
            bk = 3 - bk
        xx0, xx1 = _levels_m(bk)
        scale = _snap_all(xb, weight, L, index, 2, scale, xx0, xx1, grid, kmap, neighbours)
        y[_M_QS + 2 * ib] = np.uint8(index[0] & 255)
        y[_M_QS + 2 * ib + 1] = np.uint8(index[1] & 255)
        y[_M_QH + ib] = np.uint8((index[0] >> 8) | ((index[1] >> 8) << 4))
        blk_index[2 * ib] = index[0]
        blk_index[2 * ib + 1] = index[1]
        scales[ib] = scale
        shifts[ib] = bk
    max_scale = max_of(scales)
    if max_scale == F32(0.0):
        return
    # the 3-bit block scales, then the super-scale refitted over the whole super-block with them
    d = max_scale / F32(15.0)
    inv = F32(1.0) / d
    sc = np.zeros(4, dtype=np.int32)
    sumqx = F32(0.0)
    sumq2 = F32(0.0)
    for ib in range(16):
        l = odd_scale_level(inv, scales[ib], 7)
        sc[ib // 4] |= l << (3 * (ib % 4))
        y[_M_QH + ib] |= np.uint8((0x80 if shifts[ib] % 2 else 0) | (0x08 if shifts[ib] >= 2 else 0))
        xb = xbl[16 * ib:16 * ib + 16]
        _weights(xb, qw[16 * ib:16 * ib + 16] if use_qw else qw, use_qw, sigma2, weight)
        xx0, xx1 = _levels_m(shifts[ib])
        m = F32(2 * l + 1)
        for k in range(2):
            xx = xx0 if k == 0 else xx1
            for j in range(8):
                wj = weight[8 * k + j]
                q = xx[(np.int32(grid[blk_index[2 * ib + k], j]) - 1) // 2] * m
                sumqx += wj * q * xb[8 * k + j]
                sumq2 += wj * q * q
    if sumq2 > F32(0.0):
        d = sumqx / sumq2
    s = np.int32(fp32_to_fp16(d * F32(1.1125)))
    sc[0] |= (s & 0x000F) << 12
    sc[1] |= (s & 0x00F0) << 8
    sc[2] |= (s & 0x0F00) << 4
    sc[3] |= s & 0xF000
    for i in range(4):
        y[_M_SC + 2 * i] = np.uint8(sc[i] & 0xFF)
        y[_M_SC + 1 + 2 * i] = np.uint8((sc[i] >> 8) & 0xFF)


@njit
def _work_m():
    """IQ1_M's work arrays: ``_work``'s, and the prefix sums px, pw and the block's grid indices."""
    return _work(16, 16), np.empty((2, 17), dtype=F32), np.empty((2, 17), dtype=F32), np.empty(32, dtype=np.int32)


# ---------------------------------------------------------------------------------------------
# dequantization
# ---------------------------------------------------------------------------------------------

@njit
def _put_group(out, o, dl, grid, gi, delta):
    for j in range(8):
        out[o + j] = dl * (grid[gi, j] + delta)


@njit
def dequantize_block_iq1_s(src, out):
    """ggml's ``dequantize_row_iq1_s`` for one super-block: its bytes ``src`` -> 256 values ``out``."""
    d = get_f16(src, 0)
    for ib in range(8):
        qh = np.int32(src[_S_QH + 2 * ib]) | (np.int32(src[_S_QH + 1 + 2 * ib]) << 8)
        dl = d * F32(2 * ((qh >> 12) & 7) + 1)
        delta = -DELTA if qh & 0x8000 else DELTA
        for l in range(4):
            gi = np.int32(src[_S_QS + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
            _put_group(out, 32 * ib + 8 * l, dl, _GRID, gi, delta)


@njit
def iq1_m_scale(src):
    """IQ1_M's fp16 super-scale, spread over the top nibbles of its four scale words, as float32."""
    u = 0
    for i in range(4):
        w = np.int32(src[_M_SC + 2 * i]) | (np.int32(src[_M_SC + 1 + 2 * i]) << 8)
        u |= (w >> 12) << (4 * i)
    return fp16_to_fp32(np.uint16(u))


@njit
def dequantize_block_iq1_m(src, out):
    """ggml's ``dequantize_row_iq1_m`` for one super-block."""
    d = iq1_m_scale(src)
    for ib in range(8):
        sc = np.int32(src[_M_SC + 2 * (ib // 2)]) | (np.int32(src[_M_SC + 1 + 2 * (ib // 2)]) << 8)
        sh = 6 * (ib % 2)
        for l in range(4):
            half = l // 2  # groups 0, 1 use the first 16-block's scale, 2, 3 the second's
            qh = np.int32(src[_M_QH + 2 * ib + half])
            hi = (qh >> (4 * (l % 2))) & 0xF
            dl = d * F32(2 * ((sc >> (sh + 3 * half)) & 7) + 1)
            gi = np.int32(src[_M_QS + 4 * ib + l]) | ((hi & 7) << 8)
            _put_group(out, 32 * ib + 8 * l, dl, _GRID, gi, -DELTA if hi & 8 else DELTA)


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------

class IQ1_S(QuantType, qtype=T.IQ1_S):
    """50 bytes per 256 (module docstring): fp16 d, qs[32], qh[8] uint16."""
    requires_imatrix = True
    quantize_rows = quantizer(T.IQ1_S, _superblock_iq1_s, _work_s)
    dequantize_block = dequantize_block_iq1_s


class IQ1_M(QuantType, qtype=T.IQ1_M):
    """56 bytes per 256: qs[32], qh[16], four uint16 scale words holding the fp16 super-scale in
    their top nibbles."""
    quantize_rows = quantizer(T.IQ1_M, _superblock_iq1_m, _work_m)
    dequantize_block = dequantize_block_iq1_m
