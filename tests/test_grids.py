"""quantkit.quants.grids against gguf-py's own grid decoding (``init_grid``) and ggml's packed tables."""

from __future__ import annotations

import numpy as np
import pytest

from quantkit.errors import QuantError
from quantkit.quants.grids import grid_levels, grid_values

TYPES = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_S"]


@pytest.mark.parametrize("t", TYPES)
def test_values_equal_gguf_py_grid(t):
    import gguf.quants

    cls = getattr(gguf.quants, t)
    cls.init_grid()
    want = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    got = grid_values(t)
    assert got.shape == want.shape
    assert np.array_equal(got.astype(np.float32), want)
    assert np.array_equal(np.array(cls.grid_map, dtype=np.int16)[grid_levels(t)], got)
    assert not got.flags.writeable and grid_values(t) is got  # built once


@pytest.mark.parametrize("t,first", [
    # the first entries of ggml's kgrid_2bit_256 / kgrid_2bit_512 / kgrid_2bit_1024 / kgrid_1bit_2048
    # (ggml-quants.c, iq2xs_init_impl): 2 bits per value, value i at bits 2i
    ("IQ2_XXS", [0, 2, 5, 8, 10, 17, 20, 32, 34, 40, 42, 65, 68, 80, 88, 97]),
    ("IQ2_XS", [0, 2, 5, 8, 10, 17, 20, 22, 25, 32, 34, 37, 40, 65, 68, 70]),
    ("IQ2_S", [0, 2, 5, 8, 10, 17, 20, 22, 25, 32, 34, 37, 40, 65, 68, 70]),
    ("IQ1_S", [0, 2, 5, 8, 10, 17, 21, 32, 34, 40, 42, 69, 81, 84, 86, 101]),
])
def test_levels_pack_to_ggml_kgrid(t, first):
    lv = grid_levels(t).astype(np.int64)
    packed = (lv << (2 * np.arange(lv.shape[1]))).sum(axis=1)
    assert packed[:16].tolist() == first
    assert np.all(np.diff(packed) > 0)  # ggml's tables are sorted


def test_type_without_grid_is_refused():
    with pytest.raises(QuantError, match="Q4_K"):
        grid_values("Q4_K")
