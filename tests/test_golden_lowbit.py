"""TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS, IQ3_S: what their golden file (tests/data/golden/ggml_golden_lowbit.npz,
made by tools/make_golden_lowbit.py; docs/golden.md) must hold, and which of them gguf-py can dequantize.

The checks against the file -- every type x case x path (``quant_weights`` NULL or the case's imatrix)
byte for byte, dequantization bit for bit against ggml's ``to_float`` and gguf-py's, 1 thread == 2
threads -- are tests/test_golden.py's, which runs them over every golden file.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_golden import GOLDEN_FILES, golden

import quantkit.quants as Q

FILE = "ggml_golden_lowbit.npz"
REQUIRED = GOLDEN_FILES[FILE]


def _traits_or_fail(t: str):
    if Q.resolve_type(t) not in Q.TRAITS:
        pytest.fail(f"{t} is required but not registered in quantkit.quants.TRAITS")
    return Q.traits(t)


def test_golden_file_covers_every_type_case_and_path():
    g = golden(FILE)
    for k in ("ggml_version", "ggml_commit", "date", "command", "cases", "types"):
        assert g.meta.get(k), f"golden meta lacks {k!r}"
    assert g.meta["types"] == REQUIRED
    for t in REQUIRED:
        tr = _traits_or_fail(t)
        for c in g.meta["cases"]:
            if g[f"x:{c}"].shape[1] % tr.block_size == 0:
                for p in ("ref", "imatrix"):
                    assert f"q:{t}:{c}:{p}" in g, f"no golden data for {t} {c} {p}"
    widths = {g[f"x:{c}"].shape[1] for c in g.meta["cases"]}
    assert {256, 512, 1024} <= widths


def test_gguf_py_lacks_only_q1_0():
    """Which of these types gguf-py can dequantize (if a new gguf-py adds Q1_0, test_golden.py covers it)."""
    y = np.zeros((1, 18 * 2), dtype=np.uint8)
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(y, gguf.GGMLQuantizationType.Q1_0)
    for t in REQUIRED:
        if t != "Q1_0":
            tr = _traits_or_fail(t)
            gguf.quants.dequantize(np.zeros((1, tr.type_size), dtype=np.uint8), gguf.GGMLQuantizationType[t])
