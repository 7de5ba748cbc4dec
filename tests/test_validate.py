"""count_invalid (ggml_validate_row_data without decoding) against decoding: for every registered type, the
blocks (or, for float types, the values) it counts are exactly those that dequantize to NaN/Inf."""

from __future__ import annotations

import numpy as np
import pytest

import quantkit.quants as Q
from quantkit.errors import QuantError

TYPES = [t for t in Q.TRAITS if t.name != "Q8_K"]  # Q8_K: float32 d (3e9 fits), not an output type


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("with_imatrix", [False, True])
def test_count_invalid_matches_decoding(qtype, with_imatrix):
    tr = Q.TRAITS[qtype]
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[1, 7] = 3e9  # one block whose scale overflows fp16 (and an F16 value that does)
    x[4] *= 2e9  # a whole row of them
    x[5, :256] = 0.0  # zero blocks stay valid
    w = rng.uniform(0.1, 2.0, 512).astype(np.float32) if with_imatrix else None
    q = Q.quantize(x, qtype, imatrix=w)
    vals = Q.dequantize(q, qtype)
    if tr.info.check == "values":
        want = int(np.count_nonzero(~np.isfinite(vals)))
    else:
        blocks = vals.reshape(-1, tr.block_size)
        want = int(np.count_nonzero(~np.isfinite(blocks).all(axis=1)))
    assert Q.count_invalid(q, qtype) == want
    if qtype.name not in ("F32", "BF16"):  # those hold 3e9 exactly enough: nothing to find
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
