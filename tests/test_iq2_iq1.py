"""IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: what their golden file (tests/data/golden/ggml_golden_iq2.npz, made by
tools/make_golden_iq2.py with ggml_quantize_chunk and ggml's to_float) must hold, the refusals, and the
search tables against an independent numpy rebuild of ggml's ``iq2xs_init_impl``. The bytes, the
dequantization (quantkit's and gguf-py's against ggml's ``to_float``) and 1 vs 2 threads for every type x
case x path are tests/test_golden.py's, which runs them over every golden file.

Golden paths: ``imatrix`` for every type, ``ref`` (no importance matrix) for IQ2_S and IQ1_M; ggml
aborts without one for IQ2_XXS, IQ2_XS and IQ1_S, and quantkit refuses in one line instead.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_golden import GOLDEN_FILES
from test_golden import golden as golden_file

import quantkit.quants as Q
from quantkit.errors import QuantError
from quantkit.quants.lattice import KMAP_SIZE, lattice_tables

FILE = "ggml_golden_iq2.npz"
TYPES = GOLDEN_FILES[FILE]
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
T = gguf.GGMLQuantizationType


def golden():
    return golden_file(FILE)


def test_golden_file_covers_every_type_and_path():
    m = golden().meta
    assert m["types"] == TYPES
    assert m["requires_imatrix"] == sorted(NEEDS_IMATRIX)
    for t in TYPES:
        assert golden().paths(t) == (["imatrix"] if t in NEEDS_IMATRIX else ["ref", "imatrix"])
    widths = {golden()[f"x:{c}"].shape[1] for c in m["cases"]}
    assert {256, 512, 768, 2048} <= widths


@pytest.mark.parametrize("t", sorted(NEEDS_IMATRIX))
def test_types_ggml_refuses_without_imatrix_are_refused(t):
    x = np.ones((2, 256), np.float32)
    with pytest.raises(QuantError) as ei:
        Q.quantize(x, t)
    msg = str(ei.value)
    assert t in msg and "importance matrix" in msg and "\n" not in msg
    with pytest.raises(QuantError):
        Q.traits(t).quantize_into(x, np.empty((2, Q.traits(t).type_size), np.uint8), None)


@pytest.mark.parametrize("t", TYPES)
def test_bad_row_length_and_imatrix(t):
    with pytest.raises(QuantError, match="256"):
        Q.quantize(np.zeros((1, 384), np.float32), t, imatrix=np.ones(384, np.float32))
    with pytest.raises(QuantError, match="255"):
        Q.quantize(np.zeros((1, 256), np.float32), t, imatrix=np.ones(255, np.float32))


# -- the search tables ---------------------------------------------------------------------------
_NWANT = {"IQ2_XXS": 2, "IQ2_XS": 2, "IQ2_S": 1, "IQ1_S": 3}


@pytest.mark.parametrize("t", list(_NWANT))
def test_neighbour_lists_match_a_sorted_rebuild(t):
    """ggml's rule, rebuilt with numpy: for a candidate off the grid, sort every grid point by (squared
    distance, index) and keep the points at the first ``nwant`` distinct distances."""
    tb = lattice_tables(T[t])
    g = tb.grid.astype(np.int64)
    levels = (g - 1) // 2
    on_grid = (levels << (2 * np.arange(8))).sum(axis=1)
    assert np.array_equal(np.flatnonzero(tb.kmap >= 0), np.sort(on_grid))
    assert np.array_equal(tb.kmap[on_grid], np.arange(len(g)))
    off = np.flatnonzero(tb.kmap < 0)
    for u in np.random.default_rng(3).choice(off, 300, replace=False).tolist() + [int(off[0]), int(off[-1])]:
        pos = 2 * ((u >> (2 * np.arange(8))) & 3) + 1
        d2 = ((g - pos) ** 2).sum(axis=1)
        order = np.lexsort((np.arange(len(g)), d2))
        keep = np.isin(d2[order], np.unique(d2)[:_NWANT[t]])
        want = order[keep]
        at = -tb.kmap[u] - 1
        n = int(tb.neighbours[at])
        assert tb.neighbours[at + 1:at + 1 + n].tolist() == want.tolist(), u
    assert tb.kmap.shape == (KMAP_SIZE,)


def test_iq1_m_shares_the_iq1_s_tables():
    assert lattice_tables(T.IQ1_M) is lattice_tables(T.IQ1_S)
