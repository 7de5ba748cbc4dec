"""The type table (quantkit.formats.ggml_types) against ggml's own type traits and llama.cpp's file types.

tests/data/golden/type_traits.json holds what libggml reports for every type it defines
(tools/make_type_golden.py: ``ggml_get_type_traits`` and ``ggml_get_type_traits_cpu``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from quantkit.formats import ggml_types as G

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden" / "type_traits.json").read_text())["types"]


def test_every_ggml_type_has_a_row():
    assert sorted(G.BY_ID) == sorted(int(k) for k in GOLDEN)


@pytest.mark.parametrize("tid", sorted(int(k) for k in GOLDEN))
def test_row_matches_ggml_type_traits(tid):
    ref, row = GOLDEN[str(tid)], G.BY_ID[tid]
    assert row.ggml_name == ref["type_name"]
    assert (row.block_size, row.type_size, row.quantized) == (ref["blck_size"], ref["type_size"], ref["is_quantized"])
    want_vdt = None if ref["vec_dot_type"] is None else G.BY_ID[ref["vec_dot_type"]].name
    assert row.vec_dot_type == want_vdt


@pytest.mark.parametrize("row", [t for t in G.TYPES if t.layout], ids=lambda t: t.name)
def test_block_layout_adds_up(row):
    """The fields in struct order fill the block exactly (ggml's static_asserts on sizeof(block_X))."""
    assert sum(n for _, n in row.layout) == row.type_size
    assert len({f for f, _ in row.layout}) == len(row.layout)
    assert set(row.checked) <= set(row.offsets)
    if row.check == "f16":
        assert all(dict(row.layout)[f] == 2 for f in row.checked)


def test_named_offsets():
    assert G.type_info("Q6_K").field("d") == 208 and G.type_info("Q2_K").field("dmin") == 82
    assert G.type_info("q4_k").field("qs") == 16 and G.type_info(GGMLQuantizationType.Q3_K).field("scales") == 96
    assert G.type_info("Q4_1").check_offsets == (0, 2) and G.type_info("IQ4_XS").field("qs") == 8


def test_agrees_with_gguf_py():
    """gguf-py knows every type but Q2_0 (gguf 0.19.0); its sizes agree except Q8_1, which gguf-py
    still sizes with the old float32 d/s (40 bytes; ggml's block_q8_1 is 36)."""
    for row in G.TYPES:
        if row.name == "Q2_0":
            assert row.gguf_type is None
            continue
        assert row.gguf_type is not None and row.gguf_type.name == row.name
        if row.name != "Q8_1":
            assert GGML_QUANT_SIZES[row.gguf_type] == (row.block_size, row.type_size)
    assert {t.value for t in GGMLQuantizationType} <= set(G.BY_ID)


def test_iq4nl_values_are_gguf_pys():
    assert list(G.KVALUES_IQ4NL) == list(gguf.quants.IQ4_NL.kvalues)


def test_file_types():
    """Ids are llama.h's (gguf-py's LlamaFileType mirrors it, without Q2_0); every default type exists."""
    names = [f.name for f in G.FILE_TYPES]
    assert len(names) == len(set(names))
    llama_ids = {m.name.removeprefix("MOSTLY_").removeprefix("ALL_"): m.value for m in gguf.LlamaFileType
                 if m.name != "GUESSED"}
    for f in G.FILE_TYPES:
        if f.name == "COPY":
            continue
        if f.name == "Q2_0":
            assert "Q2_0" not in llama_ids and f.id == 41
            continue
        assert llama_ids[f.name] == f.id, f.name
        assert f.default is None or f.default in G.BY_NAME
    assert set(llama_ids) <= set(names)
    assert G.FILE_TYPE_BY_ID[0].name == "F32" and G.ftype_label(15) == "Q4_K - Medium"
    assert G.ftype_label(999) == "unknown, may not work"
    assert G.guess_ftype(["Q4_K", "Q6_K", "Q4_K"]).name == "Q4_K_M" and G.guess_ftype(["MXFP4"]).name == "F32"


def test_importable_without_numba():
    code = ("import sys, quantkit.formats.ggml_types; "
            "bad = [m for m in sys.modules if m == 'numba' or m.startswith('quantkit.quants')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
