"""count_invalid, the port of ggml_validate_row_data, against two references: the real ggml's verdict on
its own bytes (the golden files' ``rejected_by_ggml_validate_row_data``, tools/make_golden.py), and, for
every type gguf-py decodes, the blocks (or, for float types, the values) that gguf-py's dequantizer turns
into NaN/Inf."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest

import quantkit.quants as Q
from quantkit.errors import QuantError
from test_golden import GOLDEN_FILES, golden

#: Q8_K: float32 d (3e9 fits), not an output type; Q1_0: gguf-py 0.19 cannot decode it (its check is
#: test_count_invalid_needs_only_the_type_table's, and the golden files' below)
TYPES = [t for t in Q.TRAITS if t.name not in ("Q8_K", "Q1_0")]


@pytest.mark.parametrize("name", sorted(GOLDEN_FILES))
def test_count_invalid_agrees_with_ggml_on_its_golden_bytes(name):
    """Every (type, case, path) of a golden file: count_invalid finds something in ggml's bytes exactly
    when the real ggml_validate_row_data rejected them (Q4_1 and Q5_1 write an fp16 inf on
    near_fp16_max with an imatrix; everything else was accepted)."""
    g = golden(name)
    rejected = set(g.meta["rejected_by_ggml_validate_row_data"])
    checked, disagree = set(), []
    for t in GOLDEN_FILES[name]:
        for case in g.meta["cases"]:
            for path in g.paths(t):
                key = f"{t}:{case}:{path}"
                if f"q:{key}" not in g:     # the case's rows do not hold whole blocks of t
                    continue
                checked.add(key)
                if (Q.count_invalid(g[f"q:{key}"], t) > 0) != (key in rejected):
                    disagree.append(key)
    assert rejected <= checked, rejected - checked
    assert not disagree, f"count_invalid disagrees with ggml_validate_row_data on {disagree}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("with_imatrix", [False, True])
def test_count_invalid_matches_gguf_py_decoding(qtype, with_imatrix):
    tr = Q.TRAITS[qtype]
    if tr.requires_imatrix and not with_imatrix:
        pytest.skip(f"ggml quantizes {qtype.name} only with an importance matrix")
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[1, 7] = 3e9  # one block whose scale overflows fp16 (and an F16 value that does)
    x[4] *= 2e9  # a whole row of them
    x[5, :256] = 0.0  # zero blocks stay valid
    w = rng.uniform(0.1, 2.0, 512).astype(np.float32) if with_imatrix else None
    q = Q.quantize(x, qtype, imatrix=w)
    with np.errstate(all="ignore"):     # inf * 0 in the blocks under test
        vals = gguf.quants.dequantize(q, qtype)
    if tr.info.check == "values":
        want = int(np.count_nonzero(~np.isfinite(vals)))
    else:
        blocks = vals.reshape(-1, tr.block_size)
        want = int(np.count_nonzero(~np.isfinite(blocks).all(axis=1)))
    assert Q.count_invalid(q, qtype) == want
    # F32 / BF16 hold 3e9 exactly enough, and an E8M0 exponent (MXFP4) any finite scale: nothing to find
    if qtype.name not in ("F32", "BF16") and tr.info.check != "e8m0":
        assert want > 0
    assert Q.count_invalid(q[[0, 2, 3]], qtype) == 0


def test_count_invalid_refuses_bytes_that_are_not_blocks():
    with pytest.raises(QuantError, match="whole 144-byte blocks"):
        Q.count_invalid(np.zeros((2, 100), np.uint8), "Q4_K")
    with pytest.raises(QuantError, match="uint8"):
        Q.count_invalid(np.zeros((2, 144), np.float32), "Q4_K")


def test_count_invalid_q8_k_checks_its_float32_d():
    """Q8_K's d is a float32 (ggml's validate_float): a NaN or Inf d makes its block invalid."""
    q = Q.quantize(np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32), "Q8_K")
    assert Q.count_invalid(q, "Q8_K") == 0
    q[0, :4] = np.array([np.inf], "<f4").view(np.uint8)
    q[1, 292:296] = np.array([np.nan], "<f4").view(np.uint8)
    assert Q.count_invalid(q, "Q8_K") == 2


def _blocks(name, n_blocks, seed=0):
    from quantkit.formats.ggml_types import type_info

    t = type_info(name)
    return t, np.random.default_rng(seed).integers(0, 256, (2, n_blocks * t.type_size), dtype=np.uint8)


@pytest.mark.parametrize("name", ["IQ2_XXS", "TQ1_0", "Q1_0", "MXFP4", "IQ1_M", "NVFP4"])
def test_count_invalid_needs_only_the_type_table(name):
    """Types without a codec are checked from the table's fields, as ggml_validate_row_data does: an fp16
    d (IQ2_XXS, TQ1_0, Q1_0), an E8M0 exponent of 0xFF (MXFP4), IQ1_M's scale spread over the top nibbles
    of its four scale words, nothing for NVFP4's UE4M3 bytes."""
    t, rows = _blocks(name, 4)
    ts = t.type_size
    if t.check == "f16":
        rows.reshape(2, 4, ts)[:, :, t.field("d") + 1] = 0  # small finite scales everywhere
        rows[0, ts + t.field("d") + 1] = 0x7C  # block 1 of row 0: inf / NaN
        rows[1, 3 * ts + t.field("d") + 1] = 0xFE
        want = 2
    elif t.check == "e8m0":
        rows.reshape(2, 4, ts)[:, :, t.field("e")] = 0x7F
        rows[1, 2 * ts + t.field("e")] = 0xFF
        want = 1
    elif t.check == "iq1_m":
        sc = rows.reshape(2, 4, ts)[:, :, t.field("scales"):t.field("scales") + 8]
        sc[:, :, 1::2] &= 0x0F  # scale nibbles 0: a zero fp16
        # block 2 of row 1: exponent bits (0x7C00) all set -> nibbles 2 and 3 of the assembled half
        rows[1, 2 * ts + t.field("scales") + 5] |= 0xC0
        rows[1, 2 * ts + t.field("scales") + 7] |= 0x70
        want = 1
    else:
        want = 0
    assert Q.count_invalid(rows, name) == want
