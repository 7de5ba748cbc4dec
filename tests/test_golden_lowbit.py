"""TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS, IQ3_S against bytes and floats written by the real ggml
(tests/data/golden/ggml_golden_lowbit.npz, made by tools/make_golden_lowbit.py; docs/golden.md).

The same checks as tests/test_golden.py for the first sixteen types: every type x case x path
(``quant_weights`` NULL or the case's imatrix) byte for byte, dequantization bit for bit against ggml's
``to_float`` and gguf-py's, 1 thread == 2 threads. Only the golden file is read; ggml is never loaded.
"""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest
from test_golden import Golden, _bits, _describe_block_diff, _describe_float_diff

import quantkit.quants as Q

GOLDEN = Path(__file__).parent / "data" / "golden" / "ggml_golden_lowbit.npz"
REQUIRED = ["TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "IQ3_XXS", "IQ3_S"]


@functools.lru_cache(maxsize=1)
def golden() -> Golden:
    return Golden(GOLDEN)


def _params():
    g = golden()
    return [pytest.param(t, c, p, id=f"{t}-{c}-{p}")
            for t in REQUIRED for c in g.meta["cases"] for p in g.paths(t)
            if f"q:{t}:{c}:{p}" in g]


def _traits_or_fail(t: str):
    if Q.resolve_type(t) not in Q.TRAITS:
        pytest.fail(f"{t} is required but not registered in quantkit.quants.TRAITS")
    return Q.traits(t)


def _entry(t, case, path):
    g = golden()
    return g[f"x:{case}"], g[f"w:{case}"], g[f"q:{t}:{case}:{path}"], g[f"d:{t}:{case}:{path}"]


def test_golden_file_covers_every_type_case_and_path():
    g = golden()
    for k in ("ggml_version", "ggml_commit", "date", "command", "cases", "types"):
        assert g.meta.get(k), f"golden meta lacks {k!r}"
    for t in REQUIRED:
        tr = _traits_or_fail(t)
        for c in g.meta["cases"]:
            if g[f"x:{c}"].shape[1] % tr.block_size == 0:
                for p in ("ref", "imatrix"):
                    assert f"q:{t}:{c}:{p}" in g, f"no golden data for {t} {c} {p}"
    widths = {g[f"x:{c}"].shape[1] for c in g.meta["cases"]}
    assert {256, 512, 1024} <= widths


@pytest.mark.parametrize("t,case,path", _params())
def test_quantize_matches_ggml_bytes(t, case, path):
    x, w, want, _ = _entry(t, case, path)
    tr = _traits_or_fail(t)
    got = Q.quantize(x, t, imatrix=w if path == "imatrix" else None)
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if not np.array_equal(got, want):
        pytest.fail(_describe_block_diff(t, got, want, tr.type_size))


@pytest.mark.parametrize("t,case,path", _params())
def test_dequantize_matches_ggml_to_float(t, case, path):
    _, _, y, want = _entry(t, case, path)
    _traits_or_fail(t)
    got = Q.dequantize(y, t)
    assert got.dtype == np.float32 and got.shape == want.shape
    if not np.array_equal(_bits(got), _bits(want)):
        pytest.fail(_describe_float_diff(f"quantkit dequantize {t}", got, want))


@pytest.mark.parametrize("t,case,path", _params())
def test_gguf_py_dequantize_matches_ggml_to_float(t, case, path):
    _, _, y, want = _entry(t, case, path)
    try:
        got = gguf.quants.dequantize(y, gguf.GGMLQuantizationType[t])
    except NotImplementedError:
        pytest.skip(f"gguf-py {importlib.metadata.version('gguf')} cannot dequantize {t}")
    got = np.asarray(got, dtype=np.float32).reshape(want.shape)
    if not np.array_equal(_bits(got), _bits(want)):
        pytest.fail(_describe_float_diff(f"gguf-py dequantize {t}", got, want))


def test_gguf_py_lacks_only_q1_0():
    """Which of these types gguf-py can dequantize (if a new gguf-py adds Q1_0, the test above covers it)."""
    y = np.zeros((1, 18 * 2), dtype=np.uint8)
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(y, gguf.GGMLQuantizationType.Q1_0)
    for t in REQUIRED:
        if t != "Q1_0":
            tr = _traits_or_fail(t)
            gguf.quants.dequantize(np.zeros((1, tr.type_size), dtype=np.uint8), gguf.GGMLQuantizationType[t])


@pytest.mark.parametrize("t,path", [pytest.param(t, p, id=f"{t}-{p}") for t in REQUIRED
                                    for p in ("ref", "imatrix")])
def test_one_thread_equals_two_threads(t, path):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has fewer than 2 threads")
    tr = _traits_or_fail(t)
    g = golden()
    xs = [g[f"x:{c}"] for c in g.meta["cases"] if g[f"x:{c}"].shape[1] == 512]
    x = np.concatenate(xs)
    w = g[f"w:{g.meta['cases'][0]}"] if path == "imatrix" else None
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = Q.quantize(x, t, imatrix=w)
        numba.set_num_threads(2)
        two = Q.quantize(x, t, imatrix=w)
    finally:
        numba.set_num_threads(before)
    if not np.array_equal(one, two):
        pytest.fail("1 vs 2 threads: " + _describe_block_diff(t, two, one, tr.type_size))
