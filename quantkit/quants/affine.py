"""The affine family: every block stores a scale ``d`` and a minimum, ``x ~ d * q - min``.

Types: Q4_1, Q5_1 (32-element blocks) and Q2_K, Q4_K, Q5_K (256-element super-blocks whose
sub-block scales and mins are themselves quantized against two fp16 super-scales).

Bit-exact with ggml (``src/ggml-quants.c``), per ``ggml_quantize_chunk``'s dispatch:

* no importance matrix: ``quantize_row_{q4_1,q5_1,q2_K,q4_K,q5_K}_ref``;
* with an importance matrix: ``quantize_row_X_impl`` -- a weighted min/scale search
  (``make_qkx3_quants``) per block, and for the K-types a weighted quantization of the sub-block
  scales and mins (``make_qp_quants``).

Dequantization (``dequantize_row_X``, also the kernels' row decoder) is bit-exact with ``gguf.quants.dequantize``
(and ggml's ``dequantize_row_X``).

Float-exactness notes (what makes the bytes match):
* every intermediate is float32, in the C evaluation order (``w*l*x`` is ``(w*l)*x``); integers are
  converted to float32 explicitly because numba would otherwise promote ``float32 * int`` to float64;
* ``nearest_int`` is ggml's magic-number trick reproduced on the bits (quants/common.py), so it also agrees
  with ggml on NaN/inf arguments, which appear when a block's range overflows fp16;
* C stores some ints into ``uint8_t`` (wrapping), kept with ``& 0xFF``; float -> small-int casts use
  x86's truncating conversion (``c_f2i``).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit, njit_parallel, prange
from quantkit.quants.base import QuantType
from quantkit.jit import ld_u32
from quantkit.quants.common import (GROUP_MAX_EPS, block_layout, c_f2i, get_f16, ld_f16, nearest_int, put_f16, rt_len,
                                    take_columns)

F32 = np.float32
QK_K = 256

_Q4_1_TS, _Q4_1_D, _Q4_1_M, _Q4_1_QS = block_layout("Q4_1", "d", "m", "qs")
_Q5_1_TS, _Q5_1_D, _Q5_1_M, _Q5_1_QH, _Q5_1_QS = block_layout("Q5_1", "d", "m", "qh", "qs")
_Q2_K_TS, _Q2_K_SCALES, _Q2_K_QS, _Q2_K_D, _Q2_K_DMIN = block_layout("Q2_K", "scales", "qs", "d", "dmin")
_Q4_K_TS, _Q4_K_D, _Q4_K_DMIN, _Q4_K_SCALES, _Q4_K_QS = block_layout("Q4_K", "d", "dmin", "scales", "qs")
_Q5_K_TS, _Q5_K_D, _Q5_K_DMIN, _Q5_K_SCALES, _Q5_K_QH, _Q5_K_QS = block_layout("Q5_K", "d", "dmin", "scales", "qh",
                                                                             "qs")
_NEG_INF = np.float32(-np.inf)


# ---------------------------------------------------------------------------------------------
# scalar helpers
# ---------------------------------------------------------------------------------------------

@njit
def _clamp(lo, hi, v):
    return lo if v < lo else (hi if v > hi else v)


# ---------------------------------------------------------------------------------------------
# the search helpers
# ---------------------------------------------------------------------------------------------

@njit
def make_qkx2_quants(nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """Weighted (scale, min) search for ``x ~ scale * L + min`` with ``0 <= L <= nmax``.

    ggml's ``make_qkx2_quants``: start from the min/max grid, then try ``nstep + 1`` grid scales
    ``(nmax + rmin + rdelta * is) / (max - min)`` and keep the least-squares fit with the lowest
    weighted error (absolute error if ``use_mad``). Fills ``L`` (uint8), uses ``Laux`` as scratch.
    Returns ``(scale, the_min)`` where ``the_min`` is the *negated* minimum (>= 0 for min <= 0).
    One group is one lane of ``make_qkx2_quants_lanes``, where the search is.
    """
    n = x.shape[0]
    out = np.empty(2, dtype=np.float32)
    make_qkx2_quants_lanes(nmax, x.reshape(n, 1), weights[:n].reshape(n, 1), L[:n].reshape(n, 1),
                           Laux[:n].reshape(n, 1), rmin, rdelta, nstep, use_mad, out[0:1], out[1:2])
    return out[0], out[1]


@njit
def make_qkx2_quants_lanes(nmax, XT, WT, LT, AT, rmin, rdelta, nstep, use_mad, scale, the_min):
    """``make_qkx2_quants`` on ``nl`` independent groups at once, one group per column ("lane").

    ``XT``/``WT`` float32 [n, nl] hold group k's values and weights in column k; fills ``LT`` (uint8
    [n, nl]), ``scale`` and ``the_min`` (float32 [nl]); ``AT`` (uint8 [n, nl]) is scratch. Every lane runs
    ggml's search step for step with its own state (its ``min`` changes when a step improves, as in
    ggml), and every float sum is taken over i = 0..n-1 in order, so the results are bit-identical to
    calling ``make_qkx2_quants`` per group. Why lanes: the search is chains of dependent float adds,
    latency-bound per group; across groups the same loops are independent and LLVM vectorizes the
    inner ``for k in range(nl)`` loops (run-time trip count) over the lanes.
    """
    n, nl = XT.shape
    fmax = F32(nmax)
    mn = XT[0].copy()
    mx = XT[0].copy()
    sum_w = WT[0].copy()
    sum_x = np.empty(nl, dtype=np.float32)
    for k in range(nl):
        sum_x[k] = sum_w[k] * XT[0, k]
    for i in range(1, n):
        xi = XT[i]
        wi = WT[i]
        for k in range(nl):
            v = xi[k]
            mn[k] = v if v < mn[k] else mn[k]
            mx[k] = v if v > mx[k] else mx[k]
            sum_w[k] += wi[k]
            sum_x[k] += wi[k] * v
    iscale = np.empty(nl, dtype=np.float32)
    best = np.zeros(nl, dtype=np.float32)
    for k in range(nl):
        mn[k] = F32(0.0) if mn[k] > F32(0.0) else mn[k]
        iscale[k] = fmax / (mx[k] - mn[k])
        scale[k] = F32(1.0) / iscale[k]
    for i in range(n):
        xi = XT[i]
        wi = WT[i]
        li = LT[i]
        for k in range(nl):
            l = _clamp(0, nmax, nearest_int(iscale[k] * (xi[k] - mn[k])))
            li[k] = l
            diff = scale[k] * F32(l) + mn[k] - xi[k]
            diff = abs(diff) if use_mad else diff * diff
            best[k] += wi[k] * diff
    # a degenerate group (max == min: all its values equal min <= 0) keeps L = 0 and scale 0; its best
    # error of -inf lets no step replace them (the steps' inf/NaN arithmetic on it is never used)
    for k in range(nl):
        if mx[k] == mn[k]:
            best[k] = _NEG_INF
    if nstep >= 1:
        sum_l = np.empty(nl, dtype=np.float32)
        sum_l2 = np.empty(nl, dtype=np.float32)
        sum_xl = np.empty(nl, dtype=np.float32)
        this_scale = np.empty(nl, dtype=np.float32)
        this_min = np.empty(nl, dtype=np.float32)
        err = np.empty(nl, dtype=np.float32)
        better = np.empty(nl, dtype=np.bool_)
        for step in range(nstep + 1):
            grid = rmin + rdelta * F32(step) + fmax
            for k in range(nl):
                iscale[k] = grid / (mx[k] - mn[k])
                sum_l[k] = F32(0.0)
                sum_l2[k] = F32(0.0)
                sum_xl[k] = F32(0.0)
            for i in range(n):
                xi = XT[i]
                wi = WT[i]
                ai = AT[i]
                for k in range(nl):
                    l = _clamp(0, nmax, nearest_int(iscale[k] * (xi[k] - mn[k])))
                    ai[k] = l
                    w = wi[k]
                    fl = F32(l)
                    sum_l[k] += w * fl
                    sum_l2[k] += w * fl * fl
                    sum_xl[k] += w * fl * xi[k]
            for k in range(nl):
                D = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k]
                ts = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / D
                tm = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / D
                if tm > F32(0.0):
                    tm = F32(0.0)
                    ts = sum_xl[k] / sum_l2[k]
                this_scale[k] = ts
                this_min[k] = tm
                err[k] = F32(0.0)
                better[k] = D > F32(0.0)
            for i in range(n):
                xi = XT[i]
                wi = WT[i]
                ai = AT[i]
                for k in range(nl):
                    diff = this_scale[k] * F32(ai[k]) + this_min[k] - xi[k]
                    diff = abs(diff) if use_mad else diff * diff
                    err[k] += wi[k] * diff
            for k in range(nl):
                b = better[k] and err[k] < best[k]
                better[k] = b
                best[k] = err[k] if b else best[k]
                scale[k] = this_scale[k] if b else scale[k]
                mn[k] = this_min[k] if b else mn[k]
            take_columns(LT, AT, better)
    for k in range(nl):
        scale[k] = F32(0.0) if best[k] == _NEG_INF else scale[k]
        the_min[k] = -mn[k]
    for i in range(n):
        li = LT[i]
        for k in range(nl):
            li[k] = 0 if best[k] == _NEG_INF else li[k]


@njit
def make_qkx3_quants(nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """ggml's ``make_qkx3_quants`` with explicit weights (every ggml call site passes them).

    Its only difference from ``make_qkx2_quants`` is testing ``max <= min`` instead of
    ``max == min`` for the degenerate block, which is the same test for finite data (min is clamped
    to <= 0 and every x lies in [min, max]); so the search is shared.
    """
    return make_qkx2_quants(nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad)


@njit
def make_qp_quants(nmax, x, L, quant_weights):
    """Weighted quantization of non-negative values ``x`` to ``0..nmax`` with one scale, no min.

    ggml's ``make_qp_quants`` (used for the sub-block scales and mins of the K-types): best of nine
    grid scales, then up to five rounds of coordinate descent on ``sum(w x l)^2 / sum(w l^2)``.
    ``L`` is an int32 array holding what C's ``uint8_t`` would (negative values wrap modulo 256).
    Returns the scale.
    """
    n = x.shape[0]
    fmax = F32(nmax)
    mx = F32(0.0)
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F32(0.0)
    iscale = fmax / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = F32(1.0) / iscale
    best_mse = F32(0.0)
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += quant_weights[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (F32(0.1) * F32(step) + fmax) / mx
        scale_is = F32(1.0) / iscale_is
        mse = F32(0.0)
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F32(l)
            mse += quant_weights[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F32(0.0)
    suml2 = F32(0.0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        w = quant_weights[i]
        sumlx += w * x[i] * F32(l)
        suml2 += w * F32(l) * F32(l)
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = quant_weights[i]
            fl = F32(L[i])
            slx = sumlx - w * x[i] * fl
            sl2 = suml2 - w * fl * fl
            if slx > F32(0.0) and sl2 > F32(0.0):
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > F32(0.0) else F32(0.0)


@njit
def _row_sigma2(x):
    """sum(x^2) / n over a whole row, accumulated left to right in float32."""
    s = F32(0.0)
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s / F32(x.shape[0])


@njit
def _imatrix_weights(xb, qw, sigma2, out):
    """ggml's per-element weights for the weighted paths: qw * sqrt(sigma2 + x^2)."""
    for j in range(xb.shape[0]):
        out[j] = qw[j] * np.sqrt(sigma2 + xb[j] * xb[j])


# ---------------------------------------------------------------------------------------------
# Q4_1 / Q5_1: 32 values, fp16 d and m, 4- or 5-bit quants
# ---------------------------------------------------------------------------------------------

@njit
def _block_minmax_ref(xb, nmax, Lb):
    """quantize_row_q{4,5}_1_ref for one block: grid from min to max, round half up.

    Returns (d, min) and fills Lb with the 0..nmax levels as C's casts leave them.
    """
    mn = F32(3.4028234663852886e38)
    mx = F32(-3.4028234663852886e38)
    for j in range(32):
        v = xb[j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = (mx - mn) / F32(nmax)
    idd = F32(1.0) / d if d != F32(0.0) else F32(0.0)
    for j in range(32):
        t = c_f2i((xb[j] - mn) * idd + F32(0.5))
        if nmax == 15:  # (int8_t) cast, then MIN(15, .), stored to uint8
            t = t & 0xFF
            if t >= 128:
                t -= 256
            t = min(15, t) & 0xFF
        else:  # (uint8_t) cast
            t = t & 0xFF
        Lb[j] = t
    return d, mn


@njit
def _put_q4_1(yb, d, m, Lb):
    put_f16(yb, 0, d)
    put_f16(yb, 2, m)
    for j in range(16):
        yb[4 + j] = np.uint8((Lb[j] | (Lb[j + 16] << 4)) & 0xFF)


@njit
def _put_q5_1(yb, d, m, Lb):
    put_f16(yb, 0, d)
    put_f16(yb, 2, m)
    qh = np.uint32(0)
    for j in range(16):
        a = Lb[j]
        b = Lb[j + 16]
        yb[8 + j] = np.uint8((a & 0x0F) | ((b & 0x0F) << 4))
        qh |= np.uint32((a & 0x10) >> 4) << np.uint32(j)
        qh |= np.uint32((b & 0x10) >> 4) << np.uint32(j + 16)
    for k in range(4):
        yb[4 + k] = np.uint8((qh >> np.uint32(8 * k)) & np.uint32(0xFF))


@njit
def _quantize_row_x_1(x, y, qw, nmax, type_size):
    nb = x.shape[0] // 32
    Lb = np.zeros(32, dtype=np.int32)
    weighted = qw.shape[0] > 0
    # weighted: every block's make_qkx3_quants search at once, one block per lane (make_qkx2_quants_lanes,
    # bit-identical to the per-block search; the latency-bound per-block loop made Q4_1/Q5_1 with an
    # imatrix ~10x slower per value than Q4_K, whose sub-blocks already ran as lanes)
    XT = np.empty((32, nb if weighted else 0), dtype=np.float32)
    WT = np.empty_like(XT)
    LT = np.empty((32, XT.shape[1]), dtype=np.uint8)
    AT = np.empty_like(LT)
    scale = np.empty(XT.shape[1], dtype=np.float32)
    the_min = np.empty(XT.shape[1], dtype=np.float32)
    if weighted:
        sigma2 = _row_sigma2(x)
        weight = np.zeros(32, dtype=np.float32)
        for ib in range(nb):
            xb = x[ib * 32:(ib + 1) * 32]
            _imatrix_weights(xb, qw[ib * 32:(ib + 1) * 32], sigma2, weight)
            for j in range(32):
                XT[j, ib] = xb[j]
                WT[j, ib] = weight[j]
        make_qkx2_quants_lanes(nmax, XT, WT, LT, AT, F32(-0.9), F32(0.05), 36, False, scale, the_min)
    for ib in range(nb):
        yb = y[ib * type_size:(ib + 1) * type_size]
        if weighted:
            d = scale[ib]
            m = -the_min[ib]
            for j in range(32):
                Lb[j] = LT[j, ib]
        else:
            d, m = _block_minmax_ref(x[ib * 32:(ib + 1) * 32], nmax, Lb)
        if nmax == 15:
            _put_q4_1(yb, d, m, Lb)
        else:
            _put_q5_1(yb, d, m, Lb)


@njit_parallel
def quantize_rows_q4_1(x, y, qw):
    for r in prange(x.shape[0]):
        _quantize_row_x_1(x[r], y[r], qw, 15, _Q4_1_TS)


@njit_parallel
def quantize_rows_q5_1(x, y, qw):
    for r in prange(x.shape[0]):
        _quantize_row_x_1(x[r], y[r], qw, 31, _Q5_1_TS)


@njit
def dequantize_row_q4_1(src, y):
    """ggml's ``dequantize_row_q4_1``: one row's bytes ``src`` -> float32 ``y`` (the codec's and the kernels'
    row decoder)."""
    n16 = rt_len(16, y)
    for b in range(y.shape[0] // 32):
        o = _Q4_1_TS * b
        d = ld_f16(src, o + _Q4_1_D)
        m = ld_f16(src, o + _Q4_1_M)
        qs = src[o + _Q4_1_QS:o + _Q4_1_QS + 16]
        yy = y[32 * b:32 * b + 32]
        for j in range(n16):
            yy[j] = F32(np.int32(qs[j]) & 15) * d + m
        for j in range(n16):
            yy[j + 16] = F32(np.int32(qs[j]) >> 4) * d + m


@njit
def dequantize_row_q5_1(src, y):
    for b in range(y.shape[0] // 32):
        o = _Q5_1_TS * b
        d = ld_f16(src, o + _Q5_1_D)
        m = ld_f16(src, o + _Q5_1_M)
        qh = ld_u32(src, o + _Q5_1_QH)
        for j in range(16):
            q = np.int32(src[o + _Q5_1_QS + j])
            h0 = np.int32(((qh >> np.uint32(j)) << np.uint32(4)) & np.uint32(0x10))
            h1 = np.int32((qh >> np.uint32(j + 12)) & np.uint32(0x10))
            y[32 * b + j] = F32((q & 15) | h0) * d + m
            y[32 * b + j + 16] = F32((q >> 4) | h1) * d + m


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
def _q2_k_lanes_in(xb, qwb, XT, WT, sw, lane0):
    """The weighted Q2_K search's input for one super-block: its 16 sub-blocks as lanes ``lane0..+15``
    of XT/WT (values, ggml's imatrix weights), and each sub-block's weight sum in ``sw``."""
    sumx2 = F32(0.0)
    for j in range(QK_K):
        sumx2 += xb[j] * xb[j]
    sigma2 = sumx2 / F32(QK_K)
    weights = np.empty(16, dtype=np.float32)
    for j in range(16):
        xs = xb[16 * j:16 * j + 16]
        _imatrix_weights(xs, qwb[16 * j:16 * j + 16], sigma2, weights)
        s = F32(0.0)
        for l in range(16):
            s += weights[l]
            XT[l, lane0 + j] = xs[l]
            WT[l, lane0 + j] = weights[l]
        sw[j] = s


@njit
def _q2_k_super_impl(yb, L, LT, lane0, scales, mins, sw, Ls, Lm):
    """After the row's search (``make_qkx3_quants`` per sub-block, run as lanes): the levels, then the
    sub-block scales and mins quantized with ``make_qp_quants``."""
    for j in range(16):
        for l in range(16):
            L[16 * j + l] = LT[l, lane0 + j]
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
            L[16 * j + ii] = _clamp(0, 3, nearest_int((xb[16 * j + ii] + dm) / d))
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
    nl = 16 * nb if weighted else 0
    XT = np.empty((16, nl), dtype=np.float32)
    WT = np.empty((16, nl), dtype=np.float32)
    LT = np.empty((16, nl), dtype=np.uint8)
    AT = np.empty((16, nl), dtype=np.uint8)
    row_scales = np.empty(nl, dtype=np.float32)
    row_mins = np.empty(nl, dtype=np.float32)
    row_sw = np.empty(nl, dtype=np.float32)
    if weighted:
        for i in range(nb):
            _q2_k_lanes_in(x[i * QK_K:(i + 1) * QK_K], qw[i * QK_K:(i + 1) * QK_K], XT, WT,
                           row_sw[16 * i:16 * i + 16], 16 * i)
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


@njit_parallel
def quantize_rows_q2_k(x, y, qw):
    for r in prange(x.shape[0]):
        _quantize_row_q2_k(x[r], y[r], qw)


@njit
def dequantize_row_q2_k(src, y):
    n16 = rt_len(16, y)
    for b in range(y.shape[0] // QK_K):
        o = _Q2_K_TS * b
        d = ld_f16(src, o + _Q2_K_D)
        dmin = ld_f16(src, o + _Q2_K_DMIN)
        is_ = 0
        for n in range(2):
            q = o + _Q2_K_QS + 32 * n
            for j in range(4):
                shift = 2 * j
                base = 256 * b + 128 * n + 32 * j
                for half in range(2):
                    sc = np.int32(src[o + _Q2_K_SCALES + is_])
                    is_ += 1
                    dl = d * F32(sc & 15)
                    ml = dmin * F32(sc >> 4)
                    qs = src[q + 16 * half:q + 16 * half + 16]
                    yy = y[base + 16 * half:base + 16 * half + 16]
                    for l in range(n16):
                        yy[l] = dl * F32((np.int32(qs[l]) >> shift) & 3) - ml


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
    for j in range(nsub):
        for i in range(32):
            XT[i, j] = x[32 * j + i]
    if qw.shape[0] > 0:
        for ib in range(nsub // 8):
            sum_x2 = F32(0.0)
            for l in range(QK_K):
                sum_x2 += x[ib * QK_K + l] * x[ib * QK_K + l]
            sigma2 = F32(2.0) * sum_x2 / F32(QK_K)
            for j in range(8 * ib, 8 * ib + 8):
                s = F32(0.0)
                for i in range(32):
                    v = x[32 * j + i]
                    w = qw[32 * j + i] * np.sqrt(sigma2 + v * v)
                    WT[i, j] = w
                    s += w
                sw[j] = s
        make_qkx2_quants_lanes(nmax, XT, WT, LT, AT, F32(-0.9), F32(0.05), 36, False, scales, mins)
    else:
        for j in range(nsub):
            sum_x2 = F32(0.0)
            for i in range(32):
                sum_x2 += x[32 * j + i] * x[32 * j + i]
            av_x = np.sqrt(sum_x2 / F32(32.0))
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
            L[32 * j + ii] = _clamp(0, nmax, nearest_int((xb[32 * j + ii] + dm) / d))


@njit
def _quantize_row_k32(x, y, qw, nmax, type_size):
    nb = x.shape[0] // QK_K
    nsub = nb * 8
    XT = np.empty((32, nsub), dtype=np.float32)
    WT = np.empty((32, nsub), dtype=np.float32)
    LT = np.empty((32, nsub), dtype=np.uint8)
    AT = np.empty((32, nsub), dtype=np.uint8)
    scales = np.empty(nsub, dtype=np.float32)
    mins = np.empty(nsub, dtype=np.float32)
    sw = np.empty(nsub, dtype=np.float32)
    L = np.empty(QK_K, dtype=np.uint8)
    Ls = np.zeros(8, dtype=np.int32)
    Lm = np.zeros(8, dtype=np.int32)
    _k32_search(x, qw, nmax, XT, WT, LT, AT, scales, mins, sw)
    for i in range(nb):
        xb = x[i * QK_K:(i + 1) * QK_K]
        yb = y[i * type_size:(i + 1) * type_size]
        for j in range(8):
            for ii in range(32):
                L[32 * j + ii] = LT[ii, 8 * i + j]
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


@njit_parallel
def quantize_rows_q4_k(x, y, qw):
    for r in prange(x.shape[0]):
        _quantize_row_k32(x[r], y[r], qw, 15, _Q4_K_TS)


@njit_parallel
def quantize_rows_q5_k(x, y, qw):
    for r in prange(x.shape[0]):
        _quantize_row_k32(x[r], y[r], qw, 31, _Q5_K_TS)


@njit
def _sub_scales_k4(d, dmin, sc12, j):
    """``d * scale`` and ``dmin * min`` of sub-blocks 2j and 2j+1 (get_scale_min_k4's packing)."""
    sc, mn = _get_scale_min_k4(2 * j, sc12)
    sc2, mn2 = _get_scale_min_k4(2 * j + 1, sc12)
    return d * F32(sc), dmin * F32(mn), d * F32(sc2), dmin * F32(mn2)


@njit
def dequantize_row_q4_k(src, y):
    n32 = rt_len(32, y)
    for b in range(y.shape[0] // QK_K):
        o = _Q4_K_TS * b
        d = ld_f16(src, o + _Q4_K_D)
        dmin = ld_f16(src, o + _Q4_K_DMIN)
        sc12 = src[o + _Q4_K_SCALES:o + _Q4_K_SCALES + 12]
        for j in range(4):
            d1, m1, d2, m2 = _sub_scales_k4(d, dmin, sc12, j)
            q = src[o + _Q4_K_QS + 32 * j:o + _Q4_K_QS + 32 + 32 * j]
            yy = y[256 * b + 64 * j:256 * b + 64 * j + 64]
            for l in range(n32):
                yy[l] = d1 * F32(np.int32(q[l]) & 15) - m1
            for l in range(n32):
                yy[32 + l] = d2 * F32(np.int32(q[l]) >> 4) - m2


@njit
def dequantize_row_q5_k(src, y):
    for b in range(y.shape[0] // QK_K):
        o = _Q5_K_TS * b
        d = ld_f16(src, o + _Q5_K_D)
        dmin = ld_f16(src, o + _Q5_K_DMIN)
        sc12 = src[o + _Q5_K_SCALES:o + _Q5_K_SCALES + 12]
        qh = src[o + _Q5_K_QH:o + _Q5_K_QH + 32]
        for j in range(4):
            d1, m1, d2, m2 = _sub_scales_k4(d, dmin, sc12, j)
            q = src[o + _Q5_K_QS + 32 * j:o + _Q5_K_QS + 32 + 32 * j]
            yy = y[256 * b + 64 * j:256 * b + 64 * j + 64]
            for l in range(32):
                hb = ((np.int32(qh[l]) >> (2 * j)) & 1) << 4
                yy[l] = d1 * F32((np.int32(q[l]) & 15) + hb) - m1
            for l in range(32):
                hb = ((np.int32(qh[l]) >> (2 * j + 1)) & 1) << 4
                yy[32 + l] = d2 * F32((np.int32(q[l]) >> 4) + hb) - m2


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------

class Q4_1(QuantType, qtype=T.Q4_1):
    quantize_rows = quantize_rows_q4_1
    dequantize_row = dequantize_row_q4_1


class Q5_1(QuantType, qtype=T.Q5_1):
    quantize_rows = quantize_rows_q5_1
    dequantize_row = dequantize_row_q5_1


class Q2_K(QuantType, qtype=T.Q2_K):
    quantize_rows = quantize_rows_q2_k
    dequantize_row = dequantize_row_q2_k


class Q4_K(QuantType, qtype=T.Q4_K):
    quantize_rows = quantize_rows_q4_k
    dequantize_row = dequantize_row_q4_k


class Q5_K(QuantType, qtype=T.Q5_K):
    quantize_rows = quantize_rows_q5_k
    dequantize_row = dequantize_row_q5_k
