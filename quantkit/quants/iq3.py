"""IQ3_XXS and IQ3_S: 3-bit values on a D4-lattice codebook -- each group of four magnitudes is one point of
a grid of 256 (IQ3_XXS) or 512 (IQ3_S) points whose coordinates are odd levels 1, 3, .., 15, the signs
are stored apart, and one scale per 32 values is a 4-bit multiple of an fp16 super-block scale.

Bit-exact with ggml's ``quantize_row_iq3_xxs_impl`` (grid 256) and ``quantize_row_iq3_s_impl``
(grid 512), which ``ggml_quantize_chunk`` runs with or without ``quant_weights``:

* weights are ``qw * sqrt(sigma2 + x**2)`` with an imatrix (``sigma2`` twice the super-block's mean
  square), ``x**2`` without;
* the search works on magnitudes ``|x|`` (signs kept per 8 values). IQ3_XXS stores only 7 sign bits per
  8 values -- the 8th is their parity -- so when a group has an odd number of negatives, the element
  with the smallest ``w * x**2`` has its sign flipped and its magnitude negated;
* for each trial inverse scale ``(15 + 0.2 * is) / max`` (is in -15..15 for IQ3_XXS, -9..9 for IQ3_S)
  each group of four is rounded to levels ``l = nearest_int((id * |x| - 1) / 2)`` in 0..7; a point that
  is not on the grid is replaced by its best neighbour (weighted distance with ``sqrt(w)``) from the
  neighbour lists ggml builds in ``iq3xs_init_impl``; the trial with the best ``sumqx**2 / sumq2`` wins;
* groups that were off the grid are then re-rounded with the winning scale (IQ3_S re-rounds every group;
  ggml's ``continue`` for on-grid groups is commented out there) and the scale refitted;
* the super-block scale is ``max_scale / 31`` times a fudge factor (1.0125 IQ3_XXS, 1.033 IQ3_S) and
  each 32-block keeps ``nearest_int((scale / d - 1) / 2)`` in 0..15.

Layouts (docs/formats.md): IQ3_XXS (98 bytes) ``d``, ``qs[64]`` grid indices (8 per 32-block), then
one uint32 per 32-block: four 7-bit sign groups in bits 0..27 and the 4-bit scale in bits 28..31;
IQ3_S (110 bytes) ``d``, ``qs[64]`` low 8 bits of the 9-bit grid indices, ``qh[8]`` their 9th bits (one
byte per 32-block), ``signs[32]`` (one byte per 8 values), ``scales[4]`` (two 4-bit scales a byte).
A quirk kept for identity: IQ3_S advances its ``qs`` / ``signs`` write positions only for 32-blocks that
are not all zero, so a zero block shifts the following blocks' indices and signs forward (its ``qh`` bits
are written at the block's own place).

The grids come from gguf-py's copies (``gguf.quants.IQ3_XXS.grid`` / ``IQ3_S.grid``: ggml's
dequantization tables, from which the levels are read back); the neighbour lists are computed here once
per process, on first use.
"""

from __future__ import annotations

import functools

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit, njit_parallel, prange
from quantkit.quants.base import QuantType
from quantkit.quants.common import (block_layout, get_f16, imatrix_weight, max_of, nearest_int, odd_scale_level,
                                    put_f16, search_scratch, split_signs, sum_squares)

QK_K = 256
_XXS_BYTES, _XXS_D, _XXS_QS = block_layout("IQ3_XXS", "d", "qs")
_XXS_SAS = _XXS_QS + QK_K // 4  # the uint32 signs-and-scale words: the last 32 bytes of qs
_S_BYTES, _S_D, _S_QS, _S_QH, _S_SIGNS, _S_SCALES = block_layout("IQ3_S", "d", "qs", "qh", "signs", "scales")
_GROUP_MAX_EPS_IQ3_XXS = np.float32(1e-8)
_FLT_MAX = np.float32(3.4028234663852886e38)


# ---------------------------------------------------------------------------------------------
# the grids and their neighbour lists (iq3xs_init_impl)
# ---------------------------------------------------------------------------------------------
def _grid_values(name: str) -> np.ndarray:
    """gguf-py's grid of ``name`` as float32 [n_points, 4]: ggml's dequantization table
    (``iq3xxs_grid`` / ``iq3s_grid``)."""
    cls = getattr(gguf.quants, name)
    cls.init_grid()
    return np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)


#: ggml's iq3xxs_grid / iq3s_grid (the dequantization values of each point), float32 [256 | 512, 4]
GRID_IQ3_XXS = _grid_values("IQ3_XXS")
GRID_IQ3_S = _grid_values("IQ3_S")


@njit
def parity7(s):
    """The eighth sign bit IQ3_XXS (and IQ2) leave implicit: the parity of the seven stored ones
    (ggml's ``ksigns_iq2xs[s] >> 7``)."""
    p = 0
    for b in range(7):
        p ^= (s >> b) & 1
    return p


class Iq3Tables:
    """What ``iq3xs_init_impl`` builds for a grid, as arrays the kernels take.

    * ``dq``    float32 [n, 4] -- the dequantization values of each point;
    * ``q``     int8 [n, 4]    -- the point's coordinates as the quantizer sees them, ``2 * level + 1``;
    * ``kmap``  int32 [4096]   -- grid index of each 12-bit code (three bits per coordinate, first
      coordinate lowest), -1 off the grid;
    * ``nstart`` int32 [4097], ``nbr`` int32 -- neighbours of code u are ``nbr[nstart[u]:nstart[u+1]]``:
      every point at one of the ``nwant`` smallest squared distances (2 for 256 points, 3 for 512), ordered
      by distance, then by index (ggml's qsort on (d2, index)); empty for codes on the grid.
    """

    def __init__(self, name: str):
        self.dq = {"IQ3_XXS": GRID_IQ3_XXS, "IQ3_S": GRID_IQ3_S}[name]
        n = self.dq.shape[0]
        levels = np.searchsorted(np.asarray(getattr(gguf.quants, name).grid_map, dtype=np.float32), self.dq)
        self.q = (2 * levels + 1).astype(np.int8)
        codes = (levels.astype(np.int32) << np.array([0, 3, 6, 9])).sum(axis=1)
        self.kmap = np.full(4096, -1, dtype=np.int32)
        self.kmap[codes] = np.arange(n, dtype=np.int32)
        nwant = 2 if n == 256 else 3
        off = np.flatnonzero(self.kmap < 0)  # codes off the grid
        pos = 2 * ((off[:, None] >> np.array([0, 3, 6, 9])) & 7) + 1
        q = self.q.astype(np.int32)
        d2 = (pos * pos).sum(1)[:, None] + (q * q).sum(1)[None, :] - 2 * pos.astype(np.int32) @ q.T  # [n_off, n]
        limit = d2.min(axis=1)  # after the loop: the nwant-th smallest distinct distance of each code
        for _ in range(nwant - 1):
            nxt = np.where(d2 > limit[:, None], d2, np.iinfo(np.int32).max).min(axis=1)
            limit = np.where(nxt == np.iinfo(np.int32).max, limit, nxt)
        row, j = np.nonzero(d2 <= limit[:, None])
        order = np.lexsort((j, d2[row, j], row))  # per code: by distance, then index (ggml's qsort)
        counts = np.zeros(4096, dtype=np.int32)
        counts[off] = np.bincount(row, minlength=off.size)
        self.nstart = np.zeros(4097, dtype=np.int32)
        np.cumsum(counts, out=self.nstart[1:])
        self.nbr = j[order].astype(np.int32)


@functools.cache
def tables(qtype_name: str) -> Iq3Tables:
    return Iq3Tables(qtype_name)


# ---------------------------------------------------------------------------------------------
# the search (shared by both types)
# ---------------------------------------------------------------------------------------------
@njit
def _best_neighbour(u, q, nstart, nbr, xval, waux, off, scale, L):
    """``iq3_find_best_neighbour``: the neighbour of code ``u`` nearest (weighted by ``waux``) to
    ``xval[off:off+4]`` at ``scale``; writes its levels to ``L[off:off+4]``, returns its index."""
    best_d2 = _FLT_MAX
    gi = -1
    for j in range(nstart[u], nstart[u + 1]):
        g = nbr[j]
        d2 = np.float32(0.0)
        for i in range(4):
            diff = scale * np.float32(q[g, i]) - xval[off + i]
            d2 += waux[off + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = g
    for i in range(4):
        L[off + i] = (q[gi, i] - 1) // 2
    return gi


@njit
def _round_group(xval, off, inv):
    """Levels ``clamp(nearest_int((inv * x - 1) / 2), 0, 7)`` of four values, as a 12-bit code."""
    u = 0
    for i in range(4):
        l = nearest_int(np.float32(0.5) * (inv * xval[off + i] - np.float32(1.0)))
        u |= max(0, min(7, l)) << (3 * i)
    return u


@njit
def _fit(weight, xval, L):
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for i in range(32):
        w = weight[i]
        q = np.float32(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit
def _search_block(xb, qw, qoff, use_qw, sigma2, xxs, q, kmap, nstart, nbr, weight, waux, xval, L, Laux,
                  signs, on_grid, on_grid_aux):
    """One 32-value block: fills ``L`` (levels), ``signs`` (4 bytes, one per 8 values; 7 bits for
    IQ3_XXS) and returns (scale, skipped). ``xxs`` selects IQ3_XXS's variant of the search."""
    for i in range(32):
        weight[i] = imatrix_weight(qw[qoff + i], xb[i], sigma2) if use_qw else xb[i] * xb[i]
    for i in range(32):
        waux[i] = np.sqrt(weight[i])
    split_signs(xb, weight, xval, 4, xxs, signs)
    mx = max_of(xval)
    L[:] = 0
    if (mx < _GROUP_MAX_EPS_IQ3_XXS) if xxs else (mx == np.float32(0.0)):
        return np.float32(0.0), True
    best = np.float32(0.0)
    scale = mx / np.float32(15.0)
    for k in range(8):
        on_grid[k] = xxs
    nis = 15 if xxs else 9
    for is_ in range(-nis, nis + 1):
        inv = (np.float32(15.0) + np.float32(is_) * np.float32(0.2)) / mx
        this_scale = np.float32(1.0) / inv
        for k in range(8):
            u = _round_group(xval, 4 * k, inv)
            for i in range(4):
                Laux[4 * k + i] = (u >> (3 * i)) & 7
            on_grid_aux[k] = kmap[u] >= 0
            if kmap[u] < 0:
                _best_neighbour(u, q, nstart, nbr, xval, waux, 4 * k, this_scale, Laux)
        sumqx, sumq2 = _fit(weight, xval, Laux)
        if sumq2 > np.float32(0.0) and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            for i in range(32):
                L[i] = Laux[i]
            for k in range(8):
                on_grid[k] = on_grid_aux[k]
    n_off = 0
    for k in range(8):
        n_off += 0 if on_grid[k] else 1
    if n_off > 0 and scale > np.float32(0.0):
        inv = np.float32(1.0) / scale
        for k in range(8):
            if xxs and on_grid[k]:
                continue
            u = _round_group(xval, 4 * k, inv)
            g = kmap[u]
            if g < 0:
                g = _best_neighbour(u, q, nstart, nbr, xval, waux, 4 * k, scale, L)
            for i in range(4):
                L[4 * k + i] = (q[g, i] - 1) // 2
        sumqx, sumq2 = _fit(weight, xval, L)
        if sumq2 > np.float32(0.0):
            scale = sumqx / sumq2
    if scale < np.float32(0.0):  # "should never happen" (ggml): flip the scale and the signs
        scale = -scale
        for k in range(4):
            signs[k] = (~signs[k]) & (127 if xxs else 255)
    return scale, False


@njit
def _group_index(L, k, kmap):
    u = 0
    for i in range(4):
        u |= L[4 * k + i] << (3 * i)
    return kmap[u]


@njit
def _quantize_row(x, y, qw, use_qw, xxs, q, kmap, nstart, nbr):
    weight, waux, xval, L, Laux, on_grid, on_grid_aux, signs = search_scratch(32, 8)  # groups of 4
    scales = np.empty(8, dtype=np.float32)
    sas = np.empty(8, dtype=np.uint32)  # IQ3_XXS: signs and scale of each 32-block
    nbytes = _XXS_BYTES if xxs else _S_BYTES
    for ibl in range(x.shape[0] // QK_K):
        pos = nbytes * ibl
        for j in range(nbytes):
            y[pos + j] = 0
        xbl = x[QK_K * ibl:QK_K * (ibl + 1)]
        sigma2 = np.float32(2.0) * sum_squares(xbl) / np.float32(QK_K)
        max_scale = np.float32(0.0)
        qs = pos + _S_QS  # IQ3_S: where the next non-zero block's indices go
        sg = pos + _S_SIGNS
        for ib in range(8):
            scale, skipped = _search_block(xbl[32 * ib:32 * ib + 32], qw, QK_K * ibl + 32 * ib, use_qw, sigma2,
                                           xxs, q, kmap, nstart, nbr, weight, waux, xval, L, Laux, signs,
                                           on_grid, on_grid_aux)
            scales[ib] = scale
            sas[ib] = 0
            if skipped:
                continue
            for k in range(8):
                g = _group_index(L, k, kmap)
                if xxs:
                    y[pos + _XXS_QS + 8 * ib + k] = np.uint8(g)
                else:
                    y[qs + k] = np.uint8(g & 255)
                    y[pos + _S_QH + ib] |= np.uint8((g >> 8) << k)
            if xxs:
                sas[ib] = np.uint32(signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21))
            else:
                qs += 8
                for k in range(4):
                    y[sg + k] = np.uint8(signs[k])
                sg += 4
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == np.float32(0.0):
            for j in range(nbytes):
                y[pos + j] = 0
            continue
        d = max_scale / np.float32(31.0)
        put_f16(y, pos + (_XXS_D if xxs else _S_D), d * (np.float32(1.0125) if xxs else np.float32(1.033)))
        inv_d = np.float32(1.0) / d
        if xxs:
            for ib in range(8):
                v = sas[ib] | (np.uint32(odd_scale_level(inv_d, scales[ib], 15)) << np.uint32(28))
                for b in range(4):
                    y[pos + _XXS_SAS + 4 * ib + b] = np.uint8((v >> np.uint32(8 * b)) & np.uint32(255))
        else:
            for ib in range(0, 8, 2):
                y[pos + _S_SCALES + ib // 2] = np.uint8(
                    odd_scale_level(inv_d, scales[ib], 15) | (odd_scale_level(inv_d, scales[ib + 1], 15) << 4))


@njit_parallel
def _quantize_rows(x, y, qw, xxs, q, kmap, nstart, nbr):
    use_qw = qw.shape[0] > 0
    for r in prange(x.shape[0]):
        _quantize_row(x[r], y[r], qw, use_qw, xxs, q, kmap, nstart, nbr)


def _quantizer(name: str, xxs: bool):
    def quantize_rows(x, y, qw):
        t = tables(name)
        _quantize_rows(x, y, qw, xxs, t.q, t.kmap, t.nstart, t.nbr)
    quantize_rows.__name__ = f"quantize_rows_{name.lower()}"
    return quantize_rows


# ---------------------------------------------------------------------------------------------
# dequantization (dequantize_row_iq3_xxs / dequantize_row_iq3_s)
# ---------------------------------------------------------------------------------------------
@njit
def _put_group8(out, o, db, grid, g1, g2, signs):
    """Eight values: points g1, g2 of ``grid`` times ``db``, negated where bit j of ``signs`` is set."""
    for j in range(4):
        v1 = db * grid[g1, j]
        v2 = db * grid[g2, j]
        out[o + j] = -v1 if (signs >> j) & 1 else v1
        out[o + 4 + j] = -v2 if (signs >> (j + 4)) & 1 else v2


@njit
def dequantize_block_iq3_xxs(src, out):
    """ggml's ``dequantize_row_iq3_xxs`` for one super-block: its bytes ``src`` -> 256 values ``out``."""
    d = get_f16(src, _XXS_D)
    for ib in range(8):
        a = _XXS_SAS + 4 * ib
        aux = (np.uint32(src[a]) | (np.uint32(src[a + 1]) << np.uint32(8))
               | (np.uint32(src[a + 2]) << np.uint32(16)) | (np.uint32(src[a + 3]) << np.uint32(24)))
        db = d * (np.float32(0.5) + np.float32(aux >> np.uint32(28))) * np.float32(0.5)
        for l in range(4):
            s7 = np.int32((aux >> np.uint32(7 * l)) & np.uint32(127))
            qs = _XXS_QS + 8 * ib + 2 * l
            _put_group8(out, 32 * ib + 8 * l, db, GRID_IQ3_XXS, src[qs], src[qs + 1], s7 | (parity7(s7) << 7))


@njit
def dequantize_block_iq3_s(src, out):
    """ggml's ``dequantize_row_iq3_s`` for one super-block."""
    d = get_f16(src, _S_D)
    for ib in range(8):
        db = d * np.float32(1 + 2 * ((np.int32(src[_S_SCALES + ib // 2]) >> (4 * (ib % 2))) & 15))
        qh = np.int32(src[_S_QH + ib])
        for l in range(4):
            qs = _S_QS + 8 * ib + 2 * l
            g1 = np.int32(src[qs]) | (((qh >> (2 * l)) & 1) << 8)
            g2 = np.int32(src[qs + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
            _put_group8(out, 32 * ib + 8 * l, db, GRID_IQ3_S, g1, g2, np.int32(src[_S_SIGNS + 4 * ib + l]))


class IQ3_XXS(QuantType, qtype=T.IQ3_XXS):
    """98 bytes per 256 (module docstring): fp16 d, qs[96]."""
    quantize_rows = staticmethod(_quantizer("IQ3_XXS", True))
    dequantize_block = dequantize_block_iq3_xxs


class IQ3_S(QuantType, qtype=T.IQ3_S):
    """110 bytes per 256: fp16 d, qs[64], qh[8], signs[32], scales[4]."""
    quantize_rows = staticmethod(_quantizer("IQ3_S", False))
    dequantize_block = dequantize_block_iq3_s
