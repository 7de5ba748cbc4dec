"""IQ2_XXS, IQ2_XS and IQ2_S: 8 magnitudes at a time snapped to a point of a fixed grid, signs apart.

Every 256-value super-block stores one fp16 ``d``; each group of 8 values is a grid index (8, 9 or 10
bits into the 256 / 512 / 1024 points of ``quants/grids.py``, every coordinate one of 8, 25, 43) plus
sign bits; block scales are 4 bits, ``dl = d * (0.5 + s) / 4``:

* IQ2_XXS (66 bytes): per 32 values two uint32 -- four 8-bit grid indices, then four 7-bit sign masks
  and the 4-bit scale in the top bits. The 8th sign of each group is implied: an even number of
  minus signs (the quantizer flips the sign of the least important value to make it so);
* IQ2_XS (74 bytes): per 8 values a uint16 ``index | signs7 << 9``; a 4-bit scale per 16 values;
* IQ2_S (82 bytes): per 8 values the low index byte, 8 explicit sign bits, 2 high index bits in
  ``qh``; a 4-bit scale per 16 values.

The quantizers follow ggml's ``quantize_row_iq2_{xxs,xs,s}_impl`` (ggml-quants.c): per block, weights
``qw * sqrt(sigma2 + x^2)`` (IQ2_S without an imatrix: ``sigma2/4 + x^2``), a sweep of trial scales,
each group rounded to the nearest lattice candidate and, when that candidate is not a grid point,
replaced by the best of its precomputed neighbours (``quants/lattice.py``), and a weighted
least-squares scale per trial; the best trial's assignment is refined once more at its own scale.
IQ2_XXS seeds the sweep with ``make_qp_quants``. ``ggml_quantize_chunk`` refuses IQ2_XXS and IQ2_XS
without an importance matrix (``ggml_quantize_requires_imatrix``); so does quantkit. Every float
operation is float32 in ggml's order, so bytes are identical; dequantization is bit-exact with
ggml's ``dequantize_row_iq2_*`` and ``gguf.quants``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit
from quantkit.quants.search import make_qp_quants
from quantkit.quants.base import QuantType
from quantkit.quants.common import (GROUP_MAX_EPS, block_layout, get_f16, imatrix_weight, max_of, nearest_int,
                                    odd_scale_level, put_f16, search_scratch, split_signs, sum_squares)
from quantkit.quants.lattice import dequant_grid, quantizer

F32 = np.float32
QK_K = 256
_GROUP_MAX_EPS_IQ2_S = F32(1e-8)
# block sizes and field offsets, from the type table (formats/ggml_types.py)
_, _XXS_QS = block_layout("IQ2_XXS", "qs")
_, _XS_QS, _XS_SC = block_layout("IQ2_XS", "qs", "scales")
_, _S_QS, _S_QH, _S_SC = block_layout("IQ2_S", "qs", "qh", "scales")
_S_SIGNS = _S_QS + QK_K // 8  # the second half of qs: 8 sign bits per group (ggml: ``qs + QK_K/8``)
#: the grids as the dequantizers read them (values 8, 25, 43), float32 [points, 8]
_GRID_XXS = dequant_grid(T.IQ2_XXS)
_GRID_XS = dequant_grid(T.IQ2_XS)
_GRID_S = dequant_grid(T.IQ2_S)
_FLT_MAX = F32(3.4028234663852886e38)


# ---------------------------------------------------------------------------------------------
# the lattice search shared by the three types
# ---------------------------------------------------------------------------------------------

@njit
def best_neighbour(entry, neighbours, grid, xval, w, o, scale, L):
    """ggml's ``iq2_find_best_neighbour``: among the neighbours of an off-grid candidate (``entry`` is its
    negative ``kmap`` value) the grid point nearest to ``xval[o:o+8]`` at ``scale`` in the ``w``-weighted
    squared distance (the first on ties); its levels go to ``L[o:o+8]``. Returns its index. IQ1's
    ``lattice.best_neighbour`` differs in reading each coordinate through its shifted levels; sharing it
    (a table lookup per coordinate here) made IQ2 quantization 25-40 % slower, measured."""
    off = -entry - 1
    best_d2 = _FLT_MAX
    gi = -1
    for jj in range(1, np.int32(neighbours[off]) + 1):
        j = np.int32(neighbours[off + jj])
        d2 = F32(0.0)
        for i in range(8):
            diff = scale * grid[j, i] - xval[o + i]
            d2 += w[o + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = j
    if gi < 0:  # every distance inf or NaN: ggml asserts here; take the first neighbour
        gi = np.int32(neighbours[off + 1])
    for i in range(8):
        L[o + i] = (np.int32(grid[gi, i]) - 1) // 2
    return gi

@njit
def _round_group(xval, o, inv, kmap, L):
    """Levels ``clamp(nearest_int((inv * x - 1) / 2), 0, 2)`` of the 8 values at ``o`` into ``L``; returns
    the candidate's ``kmap`` entry (a grid index, or negative when off the grid)."""
    u = 0
    for i in range(8):
        l = nearest_int(F32(0.5) * (inv * xval[o + i] - F32(1.0)))
        l = 0 if l < 0 else (2 if l > 2 else l)
        L[o + i] = l
        u |= l << (2 * i)
    return kmap[u]


@njit
def _fit(xval, weight, L, n):
    """sum w*x*q and sum w*q*q with q = 2*L + 1, in ggml's order."""
    sumqx = F32(0.0)
    sumq2 = F32(0.0)
    for i in range(n):
        w = weight[i]
        q = F32(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit
def lattice_search(xval, weight, waux, ngroup, grid, kmap, neighbours, scale, top, lo, hi, refine_all, L, Laux,
                   on_grid, on_aux):
    """The trial-scale sweep of ``quantize_row_iq2_*_impl`` over ``8 * ngroup`` values: inverse scales
    ``(5 + 0.1 * is) / top`` for ``is`` in ``lo..hi``, each rounding every group to the lattice (off-grid
    candidates to their best neighbour at ``1 / inverse``) and keeping the best ``sumqx^2 / sumq2``;
    then the kept assignment's off-grid groups (every group if ``refine_all``, as IQ2_XXS) are rounded
    again at the kept scale and the scale refitted. ``scale`` is the starting scale. Leaves the levels
    in ``L`` and returns the scale (its sign unchecked, as ggml)."""
    n = 8 * ngroup
    best = F32(0.0)
    for k in range(ngroup):
        on_grid[k] = True
    for itry in range(lo, hi + 1):
        inv = (F32(5.0) + F32(itry) * F32(0.1)) / top
        this_scale = F32(1.0) / inv
        for k in range(ngroup):
            e = _round_group(xval, 8 * k, inv, kmap, Laux)
            on_aux[k] = e >= 0
            if e < 0:
                best_neighbour(e, neighbours, grid, xval, waux, 8 * k, this_scale, Laux)
        sumqx, sumq2 = _fit(xval, weight, Laux, n)
        if sumq2 > F32(0.0) and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            for i in range(n):
                L[i] = Laux[i]
            for k in range(ngroup):
                on_grid[k] = on_aux[k]
    redo = refine_all
    for k in range(ngroup):
        redo = redo or not on_grid[k]
    if redo and scale > F32(0.0):
        inv = F32(1.0) / scale
        for k in range(ngroup):
            if refine_all or not on_grid[k]:
                e = _round_group(xval, 8 * k, inv, kmap, L)
                if e < 0:
                    best_neighbour(e, neighbours, grid, xval, waux, 8 * k, scale, L)
        sumqx, sumq2 = _fit(xval, weight, L, n)
        if sumq2 > F32(0.0):
            scale = sumqx / sumq2
    return scale


@njit
def _grid_index(L, o, kmap):
    u = 0
    for i in range(8):
        u |= L[o + i] << (2 * i)
    return kmap[u]


@njit
def _weights(xb, qw, use_qw, sigma2, weight, waux):
    for i in range(xb.shape[0]):
        if use_qw:
            weight[i] = imatrix_weight(qw[i], xb[i], sigma2)
        else:  # IQ2_S without an imatrix
            weight[i] = F32(0.25) * sigma2 + xb[i] * xb[i]
    for i in range(xb.shape[0]):
        waux[i] = np.sqrt(weight[i])


# ---------------------------------------------------------------------------------------------
# IQ2_XXS
# ---------------------------------------------------------------------------------------------

@njit
def _superblock_iq2_xxs(xbl, qw, use_qw, grid, kmap, neighbours, y, w):
    (weight, waux, xval, L, Laux, on_grid, on_aux, signs), Lqp, scales, q2 = w
    q2[:] = 0
    L[:] = 0
    sigma2 = sum_squares(xbl) / F32(QK_K)
    max_scale = F32(0.0)
    for ib in range(8):
        xb = xbl[32 * ib:32 * ib + 32]
        scales[ib] = F32(0.0)
        _weights(xb, qw[32 * ib:32 * ib + 32], use_qw, sigma2, weight, waux)
        split_signs(xb, weight, xval, 4, True, signs)
        if max_of(xval) < GROUP_MAX_EPS:
            continue
        scale = make_qp_quants(4, xval, Lqp, weight)
        eff_max = scale * F32(3.0)
        if eff_max <= F32(0.0):
            continue
        scale = lattice_search(xval, weight, waux, 4, grid, kmap, neighbours, scale, eff_max, -6, 6, True,
                               L, Laux, on_grid, on_aux)
        if scale < F32(0.0):
            scale = -scale
            for k in range(4):
                signs[k] = ~signs[k] & 127
        for k in range(4):
            q2[2 * ib] |= np.uint32(_grid_index(L, 8 * k, kmap)) << np.uint32(8 * k)
            q2[2 * ib + 1] |= np.uint32(signs[k]) << np.uint32(7 * k)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == F32(0.0):
        y[:] = 0
        return
    d = max_scale / F32(31.0)
    put_f16(y, 0, d)
    inv = F32(1.0) / d
    for ib in range(8):
        q2[2 * ib + 1] |= np.uint32(odd_scale_level(inv, scales[ib], 15)) << np.uint32(28)
    for j in range(16):
        for b in range(4):
            y[_XXS_QS + 4 * j + b] = np.uint8((q2[j] >> np.uint32(8 * b)) & np.uint32(0xFF))


@njit
def _work_xxs():
    """IQ2_XXS's work arrays: a block's search arrays, make_qp_quants' levels, the block scales and the
    super-block's uint32 words."""
    return search_scratch(32, 4), np.zeros(32, dtype=np.int32), np.zeros(8, dtype=F32), np.zeros(16, dtype=np.uint32)


# ---------------------------------------------------------------------------------------------
# IQ2_XS and IQ2_S: blocks of 16
# ---------------------------------------------------------------------------------------------

@njit
def _superblock_16(xbl, qw, use_qw, is_s, grid, kmap, neighbours, w):
    """The search of IQ2_XS (``is_s`` False) or IQ2_S over the 16 blocks of 16 of a super-block: block
    scales into ``scales``, grid indices and sign masks per group of 8 into ``idx`` / ``sgn`` (of the work
    arrays ``w``); returns the largest block scale."""
    (weight, waux, xval, L, Laux, on_grid, on_aux, signs), scales, idx, sgn = w
    s2 = sum_squares(xbl)
    sigma2 = (F32(2.0) * s2 if is_s else s2) / F32(QK_K)
    eps = _GROUP_MAX_EPS_IQ2_S if is_s else GROUP_MAX_EPS
    max_scale = F32(0.0)
    for ib in range(16):
        xb = xbl[16 * ib:16 * ib + 16]
        _weights(xb, qw[16 * ib:16 * ib + 16] if use_qw else qw, use_qw, sigma2, weight, waux)
        split_signs(xb, weight, xval, 2, not is_s, signs)
        mx = max_of(xval)
        scales[ib] = F32(0.0)
        for k in range(2):
            idx[2 * ib + k] = 0
            sgn[2 * ib + k] = 0
        L[:] = 0  # the levels a block keeps when no trial scale fits (all its weights zero)
        if mx < eps:
            continue
        scale = lattice_search(xval, weight, waux, 2, grid, kmap, neighbours, mx / F32(5.0), mx, -9, 9, False,
                               L, Laux, on_grid, on_aux)
        if scale < F32(0.0):
            scale = -scale
            for k in range(2):
                signs[k] = ~signs[k] & (255 if is_s else 127)
        for k in range(2):
            idx[2 * ib + k] = _grid_index(L, 8 * k, kmap)
            sgn[2 * ib + k] = signs[k]
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    return max_scale


@njit
def _put_scales16(y, at, scales, inv):
    """4-bit ``nearest_int((inv * scale - 1) / 2)`` per block of 16, two per byte (low nibble first)."""
    for ib in range(16):
        l = odd_scale_level(inv, scales[ib], 15)
        if ib % 2 == 0:
            y[at + ib // 2] = np.uint8(l)
        else:
            y[at + ib // 2] |= np.uint8(l << 4)


@njit
def _work_16():
    """IQ2_XS's and IQ2_S's work arrays: a block's search arrays, and the super-block's block scales, grid
    indices and sign masks."""
    return search_scratch(16, 2), np.empty(16, dtype=F32), np.empty(32, dtype=np.int32), np.empty(32, dtype=np.int32)


@njit
def _superblock_iq2_xs(xbl, qw, use_qw, grid, kmap, neighbours, y, w):
    max_scale = _superblock_16(xbl, qw, use_qw, False, grid, kmap, neighbours, w)
    _, scales, idx, sgn = w
    y[:] = 0
    if max_scale == F32(0.0):
        return
    d = max_scale / F32(31.0)
    put_f16(y, 0, d)
    for j in range(32):
        v = idx[j] | (sgn[j] << 9)
        y[_XS_QS + 2 * j] = np.uint8(v & 0xFF)
        y[_XS_QS + 1 + 2 * j] = np.uint8(v >> 8)
    _put_scales16(y, _XS_SC, scales, F32(1.0) / d)


@njit
def _superblock_iq2_s(xbl, qw, use_qw, grid, kmap, neighbours, y, w):
    max_scale = _superblock_16(xbl, qw, use_qw, True, grid, kmap, neighbours, w)
    _, scales, idx, sgn = w
    y[:] = 0
    # ggml writes the grid indices and signs in its block loop, before it looks at max_scale
    for j in range(32):
        y[_S_QS + j] = np.uint8(idx[j] & 0xFF)
        y[_S_QH + j // 4] |= np.uint8((idx[j] >> 8) << (2 * (j % 4)))
        y[_S_SIGNS + j] = np.uint8(sgn[j] & 0xFF)
    if max_scale == F32(0.0):
        return
    d = max_scale / F32(31.0)
    put_f16(y, 0, d * F32(0.9875))
    _put_scales16(y, _S_SC, scales, F32(1.0) / d)


# ---------------------------------------------------------------------------------------------
# dequantization
# ---------------------------------------------------------------------------------------------

@njit
def _put_group(out, o, dl, grid, gi, signs):
    for j in range(8):
        v = dl * grid[gi, j]
        out[o + j] = -v if (signs >> j) & 1 else v


@njit
def _even_signs(s7):
    """The 8 signs of a 7-bit mask whose 8th bit makes the count of minus signs even (ggml's ksigns_iq2xs)."""
    s = s7 & 127
    p = s ^ (s >> 4)
    p ^= p >> 2
    p ^= p >> 1
    return s | ((p & 1) << 7)


@njit
def dequantize_block_iq2_xxs(src, out):
    """ggml's ``dequantize_row_iq2_xxs`` for one super-block: its bytes ``src`` -> 256 values ``out``."""
    d = get_f16(src, 0)
    for ib in range(8):
        a = _XXS_QS + 8 * ib
        aux1 = (np.uint32(src[a + 4]) | (np.uint32(src[a + 5]) << np.uint32(8))
                | (np.uint32(src[a + 6]) << np.uint32(16)) | (np.uint32(src[a + 7]) << np.uint32(24)))
        db = d * (F32(0.5) + F32(aux1 >> np.uint32(28))) * F32(0.25)
        for l in range(4):
            s = _even_signs(np.int32((aux1 >> np.uint32(7 * l)) & np.uint32(127)))
            _put_group(out, 32 * ib + 8 * l, db, _GRID_XXS, np.int32(src[a + l]), s)


@njit
def dequantize_block_iq2_xs(src, out):
    """ggml's ``dequantize_row_iq2_xs`` for one super-block."""
    d = get_f16(src, 0)
    for ib in range(8):
        sc = np.int32(src[_XS_SC + ib])
        for l in range(4):
            db = d * (F32(0.5) + F32((sc >> (4 * (l // 2))) & 0xF)) * F32(0.25)
            a = _XS_QS + 8 * ib + 2 * l
            v = np.int32(src[a]) | (np.int32(src[a + 1]) << 8)
            _put_group(out, 32 * ib + 8 * l, db, _GRID_XS, v & 511, _even_signs(v >> 9))


@njit
def dequantize_block_iq2_s(src, out):
    """ggml's ``dequantize_row_iq2_s`` for one super-block."""
    d = get_f16(src, 0)
    for ib in range(8):
        sc = np.int32(src[_S_SC + ib])
        qh = np.int32(src[_S_QH + ib])
        for l in range(4):
            db = d * (F32(0.5) + F32((sc >> (4 * (l // 2))) & 0xF)) * F32(0.25)
            gi = np.int32(src[_S_QS + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
            _put_group(out, 32 * ib + 8 * l, db, _GRID_S, gi, np.int32(src[_S_SIGNS + 4 * ib + l]))


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------

class IQ2_XXS(QuantType, qtype=T.IQ2_XXS):
    """66 bytes per 256 (module docstring): fp16 d, then per 32 values two uint32."""
    requires_imatrix = True
    quantize_rows = quantizer(T.IQ2_XXS, _superblock_iq2_xxs, _work_xxs)
    dequantize_block = dequantize_block_iq2_xxs


class IQ2_XS(QuantType, qtype=T.IQ2_XS):
    """74 bytes per 256: fp16 d, qs[32] uint16 (index | signs << 9), scales[8]."""
    requires_imatrix = True
    quantize_rows = quantizer(T.IQ2_XS, _superblock_iq2_xs, _work_16)
    dequantize_block = dequantize_block_iq2_xs


class IQ2_S(QuantType, qtype=T.IQ2_S):
    """82 bytes per 256: fp16 d, qs[64] (low index bytes, then the signs), qh[8], scales[8]."""
    quantize_rows = quantizer(T.IQ2_S, _superblock_iq2_s, _work_16)
    dequantize_block = dequantize_block_iq2_s
