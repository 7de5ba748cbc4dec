"""ggml's scale searches (``src/ggml-quants.c``): given a group of values (and weights), the levels and
the scale -- and for the affine types the minimum -- that fit them best. The legacy and K-quant codecs
(quants/legacy.py, quants/kquants.py) and IQ2_XXS call them; each is bit-exact with its ggml namesake.

* symmetric, no minimum: ``make_qx_quants`` (Q4_0, Q5_0, Q3_K, Q6_K with weights) and ``make_q3_quants``
  (Q3_K without);
* affine, ``x ~ scale * L + min``: ``make_qkx2_quants`` / ``make_qkx3_quants`` (Q4_1, Q5_1, Q2_K, Q4_K,
  Q5_K);
* non-negative values, one scale: ``make_qp_quants`` (the K-types' sub-block scales and mins, IQ2_XXS).

The searches proper run on many groups at once (``*_lanes``: group k in column k, every lane's float
sums in ggml's order, so the results equal the group-at-a-time search): the per-group chains of adds
are latency-bound, while the loops over lanes are independent and vectorize. ``lanes`` lays a row out
that way.

Float32 discipline (docs/DEVELOPING.md): every constant is ``np.float32``, every int that meets a float
is converted first (numba would otherwise promote int32 * float32 to float64), and the operation order
follows ggml's C (``w*l*x`` is ``(w*l)*x``).
"""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit
from quantkit.quants.common import GROUP_MAX_EPS, absmax_lanes, absmax_signed, nearest_int, take_columns

F32 = np.float32
_NEG_INF = np.float32(-np.inf)


@njit
def clamp(lo, hi, v):
    return lo if v < lo else (hi if v > hi else v)


@njit(inline="always")
def lanes(x, n, ldtype):
    """A row as ``n``-value groups in columns, for the lane searches: values XT [n, ng], and empty
    weights WT, levels LT and scratch AT [n, ng] (levels of dtype ``ldtype``), scales [ng]."""
    ng = x.shape[0] // n
    XT = np.empty((n, ng), dtype=np.float32)
    for g in range(ng):
        for i in range(n):
            XT[i, g] = x[n * g + i]
    return (XT, np.empty((n, ng), dtype=np.float32), np.empty((n, ng), dtype=ldtype),
            np.empty((n, ng), dtype=ldtype), np.empty(ng, dtype=np.float32))


@njit(inline="always")
def untranspose(LT, g0, L, n):
    """Levels of groups g0, g0+1, ... (columns of LT, ``n`` = LT.shape[0] values each) back in value order
    into L. Inlined, with ``n`` a literal at the call, so the loops' counts are constants."""
    for j in range(L.shape[0] // n):
        for i in range(n):
            L[n * j + i] = LT[i, g0 + j]


@njit
def _round_sym(n, nmax, iscale, x, L):
    """Levels ``clamp(nearest_int(iscale * x), -nmax, nmax - 1) + nmax`` of ``n`` values into ``L``."""
    for i in range(n):
        l = nearest_int(iscale * x[i])
        L[i] = nmax + max(-nmax, min(nmax - 1, l))


# ---------------------------------------------------------------------------------------------
# symmetric: make_qx_quants, make_q3_quants
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
    fmax, amax = absmax_signed(x[:n])
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return np.float32(0.0)
    iscale = np.float32(np.float32(-nmax) / fmax)
    if rmse_type == 0:
        _round_sym(n, nmax, iscale, x, L)
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
    sumlx[:] = np.float32(0.0)
    suml2[:] = np.float32(0.0)
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
    fmax, amax = absmax_signed(x[:n])
    if amax < GROUP_MAX_EPS:
        L[:n] = 0
        return np.float32(0.0)
    if do_rmse:  # the search proper: one group as one lane
        scale = np.empty(1, dtype=np.float32)
        make_q3_quants_lanes(nmax, x[:n].reshape(n, 1), L[:n].reshape(n, 1), scale)
        return scale[0]
    iscale = np.float32(np.float32(-nmax) / fmax)
    _round_sym(n, nmax, iscale, x, L)
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



# ---------------------------------------------------------------------------------------------
# affine: make_qkx2_quants, make_qkx3_quants; and make_qp_quants
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
    # the first fit: levels and error in one pass. The error loops stay written out here rather than in a
    # shared helper: factored out (even numba-inlined) they cost the search ~6% on fresh data.
    for i in range(n):
        xi = XT[i]
        wi = WT[i]
        li = LT[i]
        for k in range(nl):
            l = clamp(0, nmax, nearest_int(iscale[k] * (xi[k] - mn[k])))
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
                    l = clamp(0, nmax, nearest_int(iscale[k] * (xi[k] - mn[k])))
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

