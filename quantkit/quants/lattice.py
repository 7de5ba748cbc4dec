"""The search tables of ggml's ``iq2xs_init_impl``, computed from the grids, once per type.

IQ2_XXS / IQ2_XS / IQ2_S / IQ1_S / IQ1_M quantize 8 values at a time to a point of a fixed grid (256,
512, 1024 and 2048 points, see ``quants/grids.py``). Every point has 8 levels ``l`` in 0..2; the search
works on ``2*l + 1`` (1, 3, 5) and packs a candidate as ``u = sum(l_i << 2*i)`` (at most 43690):

* ``grid``   -- float32 [points, 8]: ``2*l + 1`` of every grid point (ggml's ``kgrid_q2xs``);
* ``kmap``   -- int32 [43692]: ``kmap[u]`` is the grid index of ``u`` when ``u`` is a grid point, else
  ``-(offset + 1)`` with ``neighbours[offset]`` the count ``n`` of its neighbours and
  ``neighbours[offset+1 : offset+1+n]`` their grid indices;
* neighbours of a ``u`` off the grid: the grid points at the ``nwant`` smallest distinct squared
  distances from it (3 for IQ1_S / IQ1_M, 1 for IQ2_S, 2 otherwise), every point at those distances,
  ordered by (distance, index) -- ggml's ``qsort`` with ``iq2_compare_func``, which is a total order,
  so a counting sort over the (small, integer) distances gives the same lists.

IQ1_S and IQ1_M share one table, as in ggml (``iq2_data_index``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.formats.ggml_types import type_info
from quantkit.jit import njit, prange
from quantkit.quants.base import build_kernel
from quantkit.quants.grids import grid_levels, grid_values

KMAP_SIZE = 43692
QK_K = 256
#: ggml's ``nwant`` per type (iq2xs_init_impl)
_NWANT = {T.IQ2_XXS: 2, T.IQ2_XS: 2, T.IQ2_S: 1, T.IQ1_S: 3, T.IQ1_M: 3}
_MAX_D2 = 8 * 6 * 6  # largest squared distance between two points with coordinates in 1, 3, 5, 7


class LatticeTables(NamedTuple):
    grid: np.ndarray        # float32 [points, 8], 2*l + 1
    kmap: np.ndarray        # int32 [KMAP_SIZE]
    neighbours: np.ndarray  # uint16, count-prefixed lists


@njit
def _nearest(g, u, nwant, d2, hist):
    """Squared distances ``d2[j]`` from candidate ``u`` (levels ``(u >> 2k) & 3``) to every grid point,
    their histogram, and (count of points at the ``nwant`` smallest distances, the largest of those)."""
    hist[:] = 0
    for j in range(g.shape[0]):
        s = 0
        for k in range(8):
            dk = np.int32(g[j, k]) - (2 * ((u >> (2 * k)) & 3) + 1)
            s += dk * dk
        d2[j] = s
        hist[s] += 1
    have = 0
    n = 0
    for s in range(_MAX_D2 + 1):
        if hist[s]:
            have += 1
            n += hist[s]
            if have == nwant:
                return n, s
    return n, _MAX_D2


@njit
def _build(g, nwant):
    """kmap and the neighbour lists: a first pass counts (and assigns offsets), a second writes."""
    kmap = np.full(KMAP_SIZE, -1, dtype=np.int32)
    for j in range(g.shape[0]):
        u = 0
        for k in range(8):
            u |= ((np.int32(g[j, k]) - 1) // 2) << (2 * k)
        kmap[u] = j
    d2 = np.empty(g.shape[0], dtype=np.int32)
    hist = np.empty(_MAX_D2 + 1, dtype=np.int32)
    total = 0
    for u in range(KMAP_SIZE):
        if kmap[u] < 0:
            n, _ = _nearest(g, u, nwant, d2, hist)
            kmap[u] = -(total + 1)
            total += 1 + n
    neighbours = np.empty(total, dtype=np.uint16)
    for u in range(KMAP_SIZE):
        if kmap[u] >= 0:
            continue
        n, top = _nearest(g, u, nwant, d2, hist)
        off = -kmap[u] - 1
        neighbours[off] = n
        m = off + 1
        for s in range(top + 1):  # by distance, then by index
            if hist[s]:
                for j in range(g.shape[0]):
                    if d2[j] == s:
                        neighbours[m] = j
                        m += 1
    return kmap, neighbours


_SHARED = {T.IQ1_M: T.IQ1_S}  # one table for both, as ggml's iq2_data_index


@functools.cache
def _tables(t: T) -> LatticeTables:
    g = np.ascontiguousarray(2 * grid_levels(t).astype(np.int32) + 1)
    kmap, neighbours = _build(g, _NWANT[t])
    out = LatticeTables(g.astype(np.float32), kmap, neighbours)
    for a in out:
        a.flags.writeable = False
    return out


def lattice_tables(qtype: T) -> LatticeTables:
    """The search tables of ``qtype`` (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M), built on first use."""
    t = T(qtype)
    return _tables(_SHARED.get(t, t))


@njit
def best_neighbour(entry, neighbours, grid, xval, w, o, scale, xx, L):
    """ggml's ``iq1_find_best_neighbour2``: among the neighbours of an off-grid candidate (``entry`` is its
    negative ``kmap`` value) the grid point nearest to ``xval[o:o+8]`` at ``scale`` in the ``w``-weighted
    squared distance (the first on ties), a coordinate of level l standing for ``xx[l]`` (-1, 0, 1 plus
    the block's shift); its levels go to ``L[o:o+8]``. Returns its index. When every distance is inf or
    NaN ggml scans the whole grid (reading past its input); this takes the first neighbour."""
    off = -entry - 1
    best_d2 = np.float32(3.4028234663852886e38)
    gi = -1
    for jj in range(1, np.int32(neighbours[off]) + 1):
        j = np.int32(neighbours[off + jj])
        d2 = np.float32(0.0)
        for i in range(8):
            diff = scale * xx[(np.int32(grid[j, i]) - 1) // 2] - xval[o + i]
            d2 += w[o + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            gi = j
    if gi < 0:
        gi = np.int32(neighbours[off + 1])
    for i in range(8):
        L[o + i] = (np.int32(grid[gi, i]) - 1) // 2
    return gi


# -- dequantization ---------------------------------------------------------------------------

@functools.cache
def dequant_grid(qtype: T) -> np.ndarray:
    """float32 [points, 8]: the grid as the dequantizers multiply it (``grids.grid_values``)."""
    g = np.ascontiguousarray(grid_values(qtype).astype(np.float32))
    g.flags.writeable = False
    return g


def _rows_body(x, y, qw, grid, kmap, neighbours):
    """Every super-block of every row by ``SUPER`` (a type's super-block quantizer, ``TS`` bytes out) with
    the row's work arrays ``WORK()``; prange over rows."""
    use_qw = qw.shape[0] > 0
    for r in prange(x.shape[0]):
        w = WORK()  # noqa: F821
        for ibl in range(x.shape[1] // QK_K):
            q = qw[QK_K * ibl:QK_K * (ibl + 1)] if use_qw else qw
            SUPER(x[r, QK_K * ibl:QK_K * (ibl + 1)], q, use_qw, grid, kmap, neighbours,  # noqa: F821
                  y[r, TS * ibl:TS * (ibl + 1)], w)  # noqa: F821


def quantizer(qtype: T, superblock, work):
    """A type's ``quantize_rows(x, y, qw)``: ``superblock(xbl, qw, use_qw, grid, kmap, neighbours, yb, w)``
    quantizes 256 values ``xbl`` into the block's bytes ``yb`` (``qw`` their weights when ``use_qw``),
    ``w = work()`` the work arrays a row reuses; the search tables are built on first use."""
    t = T(qtype)
    kernel = build_kernel(_rows_body, t, True, SUPER=superblock, WORK=work, TS=type_info(t).type_size)

    def quantize_rows(x, y, qw):
        tb = lattice_tables(t)
        kernel(x, y, qw, tb.grid, tb.kmap, tb.neighbours)
    quantize_rows.__name__ = f"quantize_rows_{t.name.lower()}"
    quantize_rows.kernel = kernel
    return staticmethod(quantize_rows)
