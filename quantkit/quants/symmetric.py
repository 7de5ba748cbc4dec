"""The symmetric family: one scale per block, no minimum -- Q4_0, Q5_0, Q8_0, Q3_K, Q6_K and Q8_K.

Bit-exact with ggml's ``src/ggml-quants.c``:

* ``quantize_rows(x, y, qw)`` with an empty ``qw`` is ``quantize_row_<type>_ref`` (ggml's
  ``quantize_<type>`` falls back to it when ``quant_weights`` is NULL);
* with a non-empty ``qw`` it is the weighted path: ``quantize_row_q4_0_impl`` / ``q5_0_impl`` /
  ``q3_K_impl`` / ``q6_K_impl``. Q8_0 and Q8_K ignore the weights (``uses_imatrix = False``);
* Q8_K (float32 d, int8 qs[256], int16 bsums[16]) is the activation type of the K-quants'
  dot products and is ``quantize_row_q8_K_ref``;
* ``dequantize_row_<type>`` equals ggml's and gguf-py's ``dequantize``; the kernels decode rows with it too.

The two scale searches of this family, ``make_qx_quants`` and ``make_q3_quants``, live here.

Float32 discipline (see docs/DEVELOPING.md): every constant is ``np.float32``, every int that meets
a float is converted with ``np.float32`` first (numba would otherwise promote int32*float32 to
float64), and the operation order follows ggml's C. ``nearest_int`` reproduces ggml's
magic-number rounding for every input, and ``c_f2i`` the x86 float->int conversion of C casts
(both in quants/common.py), so even degenerate blocks (subnormal maxima, infinite inverse scales) give ggml's bytes.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit, njit_parallel, prange
from quantkit.quants.base import QuantType
from quantkit.jit import ld_u32
from quantkit.quants.common import (GROUP_MAX_EPS, absmax_lanes, block_layout, c_f2i, get_f16, get_f32, ld_f16,
                                    nearest_int, put_f16, put_f32, rt_len, take_columns)

QK4_0 = 32
QK5_0 = 32
QK8_0 = 32
QK_K = 256

_Q4_0_TS, _Q4_0_D, _Q4_0_QS = block_layout("Q4_0", "d", "qs")
_Q5_0_TS, _Q5_0_D, _Q5_0_QH, _Q5_0_QS = block_layout("Q5_0", "d", "qh", "qs")
_Q8_0_TS, _Q8_0_D, _Q8_0_QS = block_layout("Q8_0", "d", "qs")
_Q3_K_TS, _Q3_K_HMASK, _Q3_K_QS, _Q3_K_SCALES, _Q3_K_D = block_layout("Q3_K", "hmask", "qs", "scales", "d")
_Q6_K_TS, _Q6_K_QL, _Q6_K_QH, _Q6_K_SCALES, _Q6_K_D = block_layout("Q6_K", "ql", "qh", "scales", "d")


# ---------------------------------------------------------------------------------------------
# scalar helpers: C's rounding and conversion behaviour
# ---------------------------------------------------------------------------------------------
@njit
def wrap_i8(v):
    """C's conversion of an int to int8_t (keep the low byte, two's complement)."""
    return np.int32(((np.int64(v) & 0xFF) ^ 0x80) - 0x80)


@njit
def c_roundf(v):
    """C's ``roundf``: nearest, ties away from zero (exact for every float32)."""
    v = np.float32(v)
    if not (np.abs(v) < np.float32(8388608.0)):  # already integral, inf or NaN
        return v
    t = np.float32(np.trunc(v))
    if np.abs(np.float32(v - t)) >= np.float32(0.5):
        t = t + (np.float32(1.0) if v > 0 else np.float32(-1.0))
    return t


# ---------------------------------------------------------------------------------------------
# scale searches shared by the symmetric types
# ---------------------------------------------------------------------------------------------
@njit
def _qx_weight(x, qw, i, rmse_type):
    if qw.shape[0] > 0:
        return qw[i]
    if rmse_type == 1:
        return x[i] * x[i]
    if rmse_type == 2:
        return np.float32(1.0)
    if rmse_type == 3:
        return np.abs(x[i])
    return np.float32(np.sqrt(np.abs(x[i])))


@njit
def make_qx_quants(n, nmax, x, L, rmse_type, qw):
    """Symmetric ``n``-value search: levels L[i] in [0, 2*nmax) (stored +nmax) and the scale.

    ggml's ``make_qx_quants``. ``qw`` is the per-value weight, or an empty array for NULL, in
    which case ``rmse_type`` picks the weight (1: x^2, 2: 1, 3: |x|, other: sqrt|x|). rmse_type 0
    only rounds; a negative rmse_type returns after the first weighted fit. Otherwise 18 further
    candidate scales -(nmax + 0.1*is)/max, is in [-9, 9] \\ {0}, are tried and the best kept.
    """
    fmax = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        ax = np.abs(x[i])
        if ax > amax:
            amax = ax
            fmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0)
    iscale = np.float32(np.float32(-nmax) / fmax)
    if rmse_type == 0:
        for i in range(n):
            l = nearest_int(iscale * x[i])
            L[i] = nmax + max(-nmax, min(nmax - 1, l))
        return np.float32(np.float32(1.0) / iscale)
    return_early = False
    if rmse_type < 0:
        rmse_type = -rmse_type
        return_early = True
    # the weights do not depend on the trial scale: compute them once
    wts = np.empty(n, dtype=np.float32)
    for i in range(n):
        wts[i] = _qx_weight(x, qw, i, rmse_type)
    if not return_early:  # the search proper: one group as one lane
        scale = np.empty(1, dtype=np.float32)
        make_qx_quants_lanes(nmax, x[:n].reshape(n, 1), wts.reshape(n, 1), L[:n].reshape(n, 1),
                             np.empty((n, 1), dtype=L.dtype), scale)
        return scale[0]
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        l = nearest_int(iscale * x[i])
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
        w = wts[i]
        fl = np.float32(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = np.float32(sumlx / suml2) if suml2 != 0 else np.float32(0.0)
    if suml2 > 0:
        return np.float32(np.float32(0.5) * (scale + np.float32(np.float32(1.0) / iscale)))
    return np.float32(np.float32(1.0) / iscale)


@njit
def _qx_lanes_fit(nmax, XT, WT, iscale, LT, sumlx, suml2):
    """Round every lane at its ``iscale`` (levels + nmax into LT) and sum its weighted fit terms."""
    n, nl = XT.shape
    for k in range(nl):
        sumlx[k] = np.float32(0.0)
        suml2[k] = np.float32(0.0)
    for i in range(n):
        xi = XT[i]
        wi = WT[i]
        li = LT[i]
        for k in range(nl):
            l = max(-nmax, min(nmax - 1, nearest_int(iscale[k] * xi[k])))
            li[k] = l + nmax
            fl = np.float32(l)
            sumlx[k] += wi[k] * xi[k] * fl
            suml2[k] += wi[k] * fl * fl


@njit
def make_qx_quants_lanes(nmax, XT, WT, LT, AT, scale):
    """``make_qx_quants`` (rmse_type 1, weights given) on ``nl`` independent groups, one per column.

    ``XT``/``WT`` float32 [n, nl]: group k's values and weights in column k. Fills ``LT`` [n, nl] with
    levels + nmax and ``scale`` [nl]; ``AT`` (same dtype as ``LT``) is scratch. Each lane does ggml's
    steps (max-magnitude scale, first weighted fit, 18 trial scales -(nmax + 0.1*is)/max) with every
    float sum over i = 0..n-1 in order, so the bytes equal the one-group-at-a-time search; the loops
    over lanes are independent and vectorize (the per-group chains of adds are latency-bound).
    """
    n, nl = XT.shape
    amax, fmax = absmax_lanes(XT)
    iscale = np.empty(nl, dtype=np.float32)
    sumlx = np.empty(nl, dtype=np.float32)
    suml2 = np.empty(nl, dtype=np.float32)
    best = np.empty(nl, dtype=np.float32)
    better = np.empty(nl, dtype=np.bool_)
    for k in range(nl):
        iscale[k] = np.float32(np.float32(-nmax) / fmax[k])
    _qx_lanes_fit(nmax, XT, WT, iscale, LT, sumlx, suml2)
    for k in range(nl):
        scale[k] = np.float32(sumlx[k] / suml2[k]) if suml2[k] != 0 else np.float32(0.0)
        best[k] = np.float32(scale[k] * sumlx[k])
    for itry in range(-9, 10):
        if itry == 0:
            continue
        grid = np.float32(np.float32(nmax) + np.float32(0.1) * np.float32(itry))
        for k in range(nl):
            iscale[k] = np.float32(-grid / fmax[k])
        _qx_lanes_fit(nmax, XT, WT, iscale, AT, sumlx, suml2)
        for k in range(nl):
            b = suml2[k] > 0 and sumlx[k] * sumlx[k] > best[k] * suml2[k]
            better[k] = b
            s = np.float32(sumlx[k] / suml2[k])
            scale[k] = s if b else scale[k]
            best[k] = np.float32(s * sumlx[k]) if b else best[k]
        take_columns(LT, AT, better)
    # a group whose largest magnitude is below GROUP_MAX_EPS is all zeros: L = 0, scale 0
    for k in range(nl):
        better[k] = amax[k] < GROUP_MAX_EPS
        scale[k] = np.float32(0.0) if better[k] else scale[k]
    for i in range(n):
        li = LT[i]
        for k in range(nl):
            li[k] = 0 if better[k] else li[k]


@njit
def make_q3_quants(n, nmax, x, L, do_rmse):
    """ggml's ``make_q3_quants``: symmetric levels (stored +nmax) and scale; with ``do_rmse`` a
    few coordinate-descent sweeps (weights x^2) move single levels while the fit improves."""
    fmax = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        ax = np.abs(x[i])
        if ax > amax:
            amax = ax
            fmax = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0)
    iscale = np.float32(np.float32(-nmax) / fmax)
    if do_rmse:  # the search proper: one group as one lane
        scale = np.empty(1, dtype=np.float32)
        make_q3_quants_lanes(nmax, x[:n].reshape(n, 1), L[:n].reshape(n, 1), scale)
        return scale[0]
    for i in range(n):
        l = nearest_int(iscale * x[i])
        l = max(-nmax, min(nmax - 1, l))
        L[i] = l + nmax
    return np.float32(np.float32(1.0) / iscale)


@njit
def make_q3_quants_lanes(nmax, XT, LT, scale):
    """``make_q3_quants`` with ``do_rmse`` on ``nl`` groups at once (group k in column k of XT [n, nl]);
    fills LT (levels + nmax) and ``scale`` [nl]. Each lane runs ggml's first fit and up to five
    coordinate-descent sweeps, stopping when a sweep changes none of its levels, with its sums updated
    in ggml's order; a lane that has stopped is left untouched while others go on."""
    n, nl = XT.shape
    amax, fmax = absmax_lanes(XT)
    iscale = np.empty(nl, dtype=np.float32)
    for k in range(nl):
        iscale[k] = np.float32(np.float32(-nmax) / fmax[k])
    sumlx = np.zeros(nl, dtype=np.float32)
    suml2 = np.zeros(nl, dtype=np.float32)
    for i in range(n):
        xi = XT[i]
        li = LT[i]
        for k in range(nl):
            l = max(-nmax, min(nmax - 1, nearest_int(iscale[k] * xi[k])))
            li[k] = l
            w = xi[k] * xi[k]
            fl = np.float32(l)
            sumlx[k] += w * xi[k] * fl
            suml2[k] += w * fl * fl
    active = np.empty(nl, dtype=np.bool_)
    changed = np.zeros(nl, dtype=np.int32)
    for k in range(nl):
        active[k] = amax[k] >= GROUP_MAX_EPS
    for itry in range(5):
        for k in range(nl):
            changed[k] = 0
        for i in range(n):
            xi = XT[i]
            li = LT[i]
            for k in range(nl):
                v = xi[k]
                w = v * v
                fli = np.float32(li[k])
                slx = np.float32(sumlx[k] - w * v * fli)
                sl2 = np.float32(suml2[k] - w * fli * fli)
                new_l = max(-nmax, min(nmax - 1, nearest_int(v * sl2 / slx)))
                fnl = np.float32(new_l)
                slx2 = slx + w * v * fnl
                sl22 = sl2 + w * fnl * fnl
                take = (active[k] & (slx > 0) & (new_l != li[k]) & (sl22 > 0)  # & not and: no branches
                        & (slx2 * slx2 * suml2[k] > sumlx[k] * sumlx[k] * sl22))
                li[k] = new_l if take else li[k]
                sumlx[k] = slx2 if take else sumlx[k]
                suml2[k] = sl22 if take else suml2[k]
                changed[k] += 1 if take else 0
        any_active = False
        for k in range(nl):
            active[k] = active[k] and changed[k] > 0
            any_active = any_active or active[k]
        if not any_active:
            break
    for k in range(nl):
        scale[k] = np.float32(sumlx[k] / suml2[k]) if suml2[k] > 0 else np.float32(0.0)
        scale[k] = np.float32(0.0) if amax[k] < GROUP_MAX_EPS else scale[k]
    for i in range(n):
        li = LT[i]
        for k in range(nl):
            li[k] = 0 if amax[k] < GROUP_MAX_EPS else li[k] + nmax


@njit
def row_sigma2(x):
    """sum(x^2)/n in float32, summed in order (the weighted legacy paths' sigma2)."""
    s = np.float32(0.0)
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return np.float32(s / np.float32(x.shape[0]))


@njit
def absmax_signed(x):
    """The value of largest magnitude (first one on ties), and its magnitude."""
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for j in range(x.shape[0]):
        a = np.abs(x[j])
        if amax < a:
            amax = a
            vmax = x[j]
    return vmax, amax


# ---------------------------------------------------------------------------------------------
# Q4_0: fp16 d, qs[16] (value j in the low nibble of byte j, value j+16 in the high nibble)
# ---------------------------------------------------------------------------------------------
@njit
def q4_0_row_ref(x, y):
    for ib in range(x.shape[0] // QK4_0):
        xb = x[ib * QK4_0:(ib + 1) * QK4_0]
        o = ib * 18
        vmax, _ = absmax_signed(xb)
        d = np.float32(vmax / np.float32(-8.0))
        idl = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
        put_f16(y, o, d)
        for j in range(16):
            x0 = np.float32(xb[j] * idl)
            x1 = np.float32(xb[j + 16] * idl)
            xi0 = min(15, wrap_i8(c_f2i(x0 + np.float32(8.5)))) & 0xFF
            xi1 = min(15, wrap_i8(c_f2i(x1 + np.float32(8.5)))) & 0xFF
            y[o + 2 + j] = np.uint8((xi0 | (xi1 << 4)) & 0xFF)


@njit
def _legacy_impl_search(x, qw, nmax):
    """quantize_row_q{4,5}_0_impl's searches for a whole row: weights with the row's sigma2, every
    32-block a lane. Returns the levels (LT[j, block]) and the block scales."""
    sigma2 = row_sigma2(x)
    XT, WT, LT, AT, d = _lanes(x, 32)
    for i in range(32):
        for g in range(XT.shape[1]):
            WT[i, g] = _imatrix_weight(qw[32 * g + i], XT[i, g], sigma2)
    make_qx_quants_lanes(nmax, XT, WT, LT, AT, d)
    return LT, d


@njit
def q4_0_row_impl(x, y, qw):
    LT, d = _legacy_impl_search(x, qw, 8)
    for ib in range(d.shape[0]):
        o = ib * 18
        put_f16(y, o, d[ib])
        for j in range(16):
            y[o + 2 + j] = np.uint8((np.int32(LT[j, ib]) | (np.int32(LT[j + 16, ib]) << 4)) & 0xFF)


@njit
def dequantize_row_q4_0(src, y):
    """ggml's ``dequantize_row_q4_0``: one row's bytes ``src`` -> float32 ``y`` (the codec's and the kernels'
    row decoder)."""
    n16 = rt_len(16, y)
    for b in range(y.shape[0] // QK4_0):
        o = _Q4_0_TS * b
        d = ld_f16(src, o + _Q4_0_D)
        qs = src[o + _Q4_0_QS:o + _Q4_0_QS + 16]
        yy = y[32 * b:32 * b + 32]
        for j in range(n16):
            yy[j] = np.float32((np.int32(qs[j]) & 15) - 8) * d
        for j in range(n16):
            yy[j + 16] = np.float32((np.int32(qs[j]) >> 4) - 8) * d


# ---------------------------------------------------------------------------------------------
# Q5_0: fp16 d, qh[4] (bit j = 5th bit of value j), qs[16] (low nibbles as Q4_0)
# ---------------------------------------------------------------------------------------------
@njit
def _q5_0_pack(y, o, l0, l1, j, qh):
    """Store levels l0 (value j) and l1 (value j+16) of a Q5_0 block; return qh with their fifth bits."""
    y[o + 6 + j] = np.uint8((l0 & 0x0F) | ((l1 & 0x0F) << 4))
    qh |= np.uint32((l0 & 0x10) >> 4) << np.uint32(j)
    qh |= np.uint32((l1 & 0x10) >> 4) << np.uint32(j + 16)
    return qh


@njit
def _put_u32(y, o, v):
    for k in range(4):
        y[o + k] = np.uint8((v >> np.uint32(8 * k)) & np.uint32(0xFF))


@njit
def q5_0_row_ref(x, y):
    for ib in range(x.shape[0] // QK5_0):
        xb = x[ib * QK5_0:(ib + 1) * QK5_0]
        o = ib * 22
        vmax, _ = absmax_signed(xb)
        d = np.float32(vmax / np.float32(-16.0))
        idl = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
        put_f16(y, o, d)
        qh = np.uint32(0)
        for j in range(16):
            x0 = np.float32(xb[j] * idl)
            x1 = np.float32(xb[j + 16] * idl)
            xi0 = min(31, wrap_i8(c_f2i(x0 + np.float32(16.5)))) & 0xFF
            xi1 = min(31, wrap_i8(c_f2i(x1 + np.float32(16.5)))) & 0xFF
            qh = _q5_0_pack(y, o, xi0, xi1, j, qh)
        _put_u32(y, o + 2, qh)


@njit
def q5_0_row_impl(x, y, qw):
    LT, d = _legacy_impl_search(x, qw, 16)
    for ib in range(d.shape[0]):
        o = ib * 22
        put_f16(y, o, d[ib])
        qh = np.uint32(0)
        for j in range(16):
            qh = _q5_0_pack(y, o, np.int32(LT[j, ib]) & 0xFF, np.int32(LT[j + 16, ib]) & 0xFF, j, qh)
        _put_u32(y, o + 2, qh)


@njit
def dequantize_row_q5_0(src, y):
    for b in range(y.shape[0] // QK5_0):
        o = _Q5_0_TS * b
        d = ld_f16(src, o + _Q5_0_D)
        qh = ld_u32(src, o + _Q5_0_QH)
        for j in range(16):
            q = np.int32(src[o + _Q5_0_QS + j])
            h0 = np.int32(((qh >> np.uint32(j)) << np.uint32(4)) & np.uint32(0x10))
            h1 = np.int32((qh >> np.uint32(j + 12)) & np.uint32(0x10))
            y[32 * b + j] = np.float32(((q & 15) | h0) - 16) * d
            y[32 * b + j + 16] = np.float32(((q >> 4) | h1) - 16) * d


# ---------------------------------------------------------------------------------------------
# Q8_0: fp16 d, int8 qs[32]
# ---------------------------------------------------------------------------------------------
@njit
def q8_0_row_ref(x, y):
    for ib in range(x.shape[0] // QK8_0):
        xb = x[ib * QK8_0:(ib + 1) * QK8_0]
        o = ib * 34
        amax = np.float32(0.0)
        for j in range(QK8_0):
            amax = max(amax, np.abs(xb[j]))
        d = np.float32(amax / np.float32(127.0))
        idl = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
        put_f16(y, o, d)
        for j in range(QK8_0):
            y[o + 2 + j] = np.uint8(c_f2i(c_roundf(xb[j] * idl)) & 0xFF)


@njit
def dequantize_row_q8_0(src, y):
    n32 = rt_len(32, y)
    for b in range(y.shape[0] // QK8_0):
        o = _Q8_0_TS * b
        d = ld_f16(src, o + _Q8_0_D)
        q = src[o + _Q8_0_QS:o + _Q8_0_QS + 32]
        yy = y[32 * b:32 * b + 32]
        for j in range(n32):
            yy[j] = np.float32(np.int8(q[j])) * d


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
    XT, _, LT, _, sc = _lanes(x, 16)
    make_q3_quants_lanes(4, XT, LT, sc)
    L = np.empty(QK_K, dtype=np.int8)
    for ib in range(x.shape[0] // QK_K):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 110
        scales = sc[16 * ib:16 * ib + 16]
        _untranspose(LT, 16 * ib, L)
        max_scale = np.float32(0.0)
        amax = np.float32(0.0)
        for j in range(QK_K // 16):
            s = np.abs(scales[j])
            if s > amax:
                amax = s
                max_scale = scales[j]
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
    XT, WT, LT, AT, sc = _lanes(x, 16)
    sw = np.empty(XT.shape[1], dtype=np.float32)
    for ib in range(nb):
        sumx2 = np.float32(0.0)
        for j in range(QK_K):
            sumx2 += x[ib * QK_K + j] * x[ib * QK_K + j]
        sigma2 = np.float32(np.float32(2.0) * sumx2 / np.float32(QK_K))
        for g in range(16 * ib, 16 * ib + 16):
            sumw = np.float32(0.0)
            for l in range(16):
                w = _imatrix_weight(qw[16 * g + l], XT[l, g], sigma2)
                WT[l, g] = w
                sumw += w
            sw[g] = sumw
    make_qx_quants_lanes(4, XT, WT, LT, AT, sc)
    L = np.empty(QK_K, dtype=np.int8)
    Ls = np.empty(QK_K // 16, dtype=np.int8)
    for ib in range(nb):
        xb = x[ib * QK_K:(ib + 1) * QK_K]
        o = ib * 110
        _untranspose(LT, 16 * ib, L)
        for k in range(12):
            y[o + 96 + k] = 0
        d_block = make_qx_quants(QK_K // 16, 32, sc[16 * ib:16 * ib + 16], Ls, 1, sw[16 * ib:16 * ib + 16])
        sc12 = y[o + 96:o + 108]
        for j in range(QK_K // 16):
            _q3_k_put_scale(sc12, j, np.int32(Ls[j]))
        put_f16(y, o + 108, d_block)
        _q3_k_finish(xb, y, o, L)


@njit
def dequantize_row_q3_k(src, y):
    n16 = rt_len(16, y)
    for b in range(y.shape[0] // QK_K):
        o = _Q3_K_TS * b
        d_all = ld_f16(src, o + _Q3_K_D)
        sc = src[o + _Q3_K_SCALES:o + _Q3_K_SCALES + 12]
        is_ = 0
        m = 1
        for n in range(2):
            q = o + _Q3_K_QS + 32 * n
            for j in range(4):
                shift = 2 * j
                base = 256 * b + 128 * n + 32 * j
                for half in range(2):
                    dl = d_all * np.float32(_q3_k_get_scale(sc, is_))
                    is_ += 1
                    qs = src[q + 16 * half:q + 16 * half + 16]
                    hm = src[o + _Q3_K_HMASK + 16 * half:o + _Q3_K_HMASK + 16 * half + 16]
                    yy = y[base + 16 * half:base + 16 * half + 16]
                    for l in range(n16):
                        hv = 0 if (np.int32(hm[l]) & m) else 4
                        yy[l] = dl * np.float32(((np.int32(qs[l]) >> shift) & 3) - hv)
                m <<= 1


# ---------------------------------------------------------------------------------------------
# rows as lanes: the searches run on every group of a row at once (make_qx_quants_lanes)
# ---------------------------------------------------------------------------------------------
@njit
def _lanes(x, n):
    """A row as ``n``-value groups in columns, for make_qx_quants_lanes: values XT [n, ng], and empty
    weights WT, levels LT and scratch AT [n, ng], scales [ng]."""
    ng = x.shape[0] // n
    XT = np.empty((n, ng), dtype=np.float32)
    for g in range(ng):
        for i in range(n):
            XT[i, g] = x[n * g + i]
    return (XT, np.empty((n, ng), dtype=np.float32), np.empty((n, ng), dtype=np.int8),
            np.empty((n, ng), dtype=np.int8), np.empty(ng, dtype=np.float32))


@njit
def _imatrix_weight(qw, v, sigma2):
    """The weighted legacy and K paths' per-value weight, qw * sqrt(sigma2 + x^2)."""
    return qw * np.float32(np.sqrt(np.float32(sigma2 + v * v)))


@njit
def _untranspose(LT, g0, L):
    """Levels of groups g0, g0+1, ... (columns of LT) back in value order into L."""
    n = LT.shape[0]
    for j in range(L.shape[0] // n):
        for i in range(n):
            L[n * j + i] = LT[i, g0 + j]


# ---------------------------------------------------------------------------------------------
# Q6_K: ql[128], qh[64], int8 scales[16], fp16 d -- 210 bytes per 256 values
# ---------------------------------------------------------------------------------------------
@njit
def q6_k_row(x, y, qw):
    """``quantize_row_q6_K_ref`` (empty qw) or ``quantize_row_q6_K_impl``; they differ only in
    the weights make_qx_quants gets."""
    nb = x.shape[0] // QK_K
    XT, WT, LT, AT, sc = _lanes(x, 16)
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
        _untranspose(LT, 16 * ib, L)
        max_scale = np.float32(0.0)
        max_abs_scale = np.float32(0.0)
        for j in range(QK_K // 16):
            s = scales[j]
            a = np.abs(s)
            if a > max_abs_scale:
                max_abs_scale = a
                max_scale = s
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


@njit
def dequantize_row_q6_k(src, y):
    for b in range(y.shape[0] // QK_K):
        o = _Q6_K_TS * b
        d = ld_f16(src, o + _Q6_K_D)
        for n in range(2):
            ql = src[o + _Q6_K_QL + 64 * n:o + _Q6_K_QL + 64 * n + 64]
            qh = src[o + _Q6_K_QH + 32 * n:o + _Q6_K_QH + 32 * n + 32]
            sc = o + _Q6_K_SCALES + 8 * n
            yy = y[256 * b + 128 * n:256 * b + 128 * n + 128]
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
        fmax = np.float32(0.0)
        amax = np.float32(0.0)
        for j in range(QK_K):
            ax = np.abs(xb[j])
            if ax > amax:
                amax = ax
                fmax = xb[j]
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


@njit
def dequantize_row_q8_k(y, x):
    for ib in range(x.shape[0] // QK_K):
        o = ib * 292
        d = get_f32(y, o)
        for j in range(QK_K):
            x[ib * QK_K + j] = d * np.float32(wrap_i8(y[o + 4 + j]))


# ---------------------------------------------------------------------------------------------
# rows kernels (parallel over rows; each row is independent, so bytes do not depend on threads)
# ---------------------------------------------------------------------------------------------
@njit_parallel
def quantize_rows_q4_0(x, y, qw):
    for r in prange(x.shape[0]):
        if qw.shape[0] == 0:
            q4_0_row_ref(x[r], y[r])
        else:
            q4_0_row_impl(x[r], y[r], qw)


@njit_parallel
def quantize_rows_q5_0(x, y, qw):
    for r in prange(x.shape[0]):
        if qw.shape[0] == 0:
            q5_0_row_ref(x[r], y[r])
        else:
            q5_0_row_impl(x[r], y[r], qw)


@njit_parallel
def quantize_rows_q8_0(x, y, qw):
    for r in prange(x.shape[0]):
        q8_0_row_ref(x[r], y[r])


@njit_parallel
def quantize_rows_q3_k(x, y, qw):
    for r in prange(x.shape[0]):
        if qw.shape[0] == 0:
            q3_k_row_ref(x[r], y[r])
        else:
            q3_k_row_impl(x[r], y[r], qw)


@njit_parallel
def quantize_rows_q6_k(x, y, qw):
    for r in prange(x.shape[0]):
        q6_k_row(x[r], y[r], qw)


@njit_parallel
def quantize_rows_q8_k(x, y, qw):
    for r in prange(x.shape[0]):
        q8_k_row_ref(x[r], y[r])


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------
class Q4_0(QuantType, qtype=T.Q4_0):
    quantize_rows = quantize_rows_q4_0
    dequantize_row = dequantize_row_q4_0


class Q5_0(QuantType, qtype=T.Q5_0):
    quantize_rows = quantize_rows_q5_0
    dequantize_row = dequantize_row_q5_0


class Q8_0(QuantType, qtype=T.Q8_0):
    uses_imatrix = False  # ggml's quantize_q8_0 ignores quant_weights
    quantize_rows = quantize_rows_q8_0
    dequantize_row = dequantize_row_q8_0


class Q3_K(QuantType, qtype=T.Q3_K):
    quantize_rows = quantize_rows_q3_k
    dequantize_row = dequantize_row_q3_k


class Q6_K(QuantType, qtype=T.Q6_K):
    quantize_rows = quantize_rows_q6_k
    dequantize_row = dequantize_row_q6_k


class Q8_K(QuantType, qtype=T.Q8_K):
    uses_imatrix = False  # quantize_row_q8_K_ref has no weighted variant
    quantize_rows = quantize_rows_q8_k
    dequantize_row = dequantize_row_q8_k
