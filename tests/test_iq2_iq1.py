"""IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M against the real ggml (tests/data/golden/ggml_golden_iq2.npz, made by
tools/make_golden_iq2.py with ggml_quantize_chunk and ggml's to_float), against gguf-py's dequantizers,
and the search tables against an independent numpy rebuild of ggml's ``iq2xs_init_impl``.

Golden paths: ``imatrix`` for every type, ``ref`` (no importance matrix) for IQ2_S and IQ1_M; ggml
aborts without one for IQ2_XXS, IQ2_XS and IQ1_S, and quantkit refuses in one line instead.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest
from test_golden import Golden, _bits, _describe_block_diff, _describe_float_diff, check_one_vs_two_threads

import quantkit.quants as Q
from quantkit.errors import QuantError
from quantkit.quants.lattice import KMAP_SIZE, lattice_tables

GOLDEN = Path(__file__).parent / "data" / "golden" / "ggml_golden_iq2.npz"
TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
T = gguf.GGMLQuantizationType


@functools.lru_cache(maxsize=1)
def golden() -> Golden:
    return Golden(GOLDEN)


def _params():
    g = golden()
    return [pytest.param(t, c, p, id=f"{t}-{c}-{p}") for t in TYPES for c in g.meta["cases"] for p in g.paths(t)]


def _entry(t, case, path):
    g = golden()
    return g[f"x:{case}"], g[f"w:{case}"], g[f"q:{t}:{case}:{path}"], g[f"d:{t}:{case}:{path}"]


def test_golden_file_covers_every_type_and_path():
    m = golden().meta
    assert m["types"] == TYPES
    assert m["requires_imatrix"] == sorted(NEEDS_IMATRIX)
    for t in TYPES:
        assert golden().paths(t) == (["imatrix"] if t in NEEDS_IMATRIX else ["ref", "imatrix"])
    widths = {golden()[f"x:{c}"].shape[1] for c in m["cases"]}
    assert {256, 512, 768, 2048} <= widths


@pytest.mark.parametrize("t,case,path", _params())
def test_quantize_matches_ggml_bytes(t, case, path):
    x, w, want, _ = _entry(t, case, path)
    got = Q.quantize(x, t, imatrix=w if path == "imatrix" else None)
    assert got.shape == want.shape
    if not np.array_equal(got, want):
        pytest.fail(_describe_block_diff(t, got, want, Q.traits(t).type_size))


@pytest.mark.parametrize("t,case,path", _params())
def test_dequantize_matches_ggml_and_gguf_py(t, case, path):
    _, _, y, want = _entry(t, case, path)
    got = Q.dequantize(y, t)
    if not np.array_equal(_bits(got), _bits(want)):
        pytest.fail(_describe_float_diff(f"quantkit dequantize {t}", got, want))
    ref = np.asarray(gguf.quants.dequantize(y, T[t]), dtype=np.float32).reshape(want.shape)
    if not np.array_equal(_bits(ref), _bits(want)):
        pytest.fail(_describe_float_diff(f"gguf-py dequantize {t}", ref, want))


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


@pytest.mark.parametrize("t,path", [(t, p) for t in TYPES for p in ("ref", "imatrix")
                                    if p == "imatrix" or t not in NEEDS_IMATRIX])
def test_one_thread_equals_two_threads(t, path):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has fewer than 2 threads")
    g = golden()
    x = np.concatenate([g[f"x:{c}"] for c in g.meta["cases"] if g[f"x:{c}"].shape[1] == 512])
    check_one_vs_two_threads(t, x, g[f"w:{g.meta['cases'][0]}"] if path == "imatrix" else None)


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
