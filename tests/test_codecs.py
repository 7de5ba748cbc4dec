"""What every codec of the registry (quants/codecs.py's ``TRAITS``) must do, one test each, parametrized over
the registry so a new type is covered the day its line lands: decode arbitrary bytes as gguf-py does, bit for
bit, and quantize to the same bytes at any thread count, with and without an imatrix. What is particular to
a family (its bytes against ggml, its searches, its edge blocks) stays in that family's test file."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quantkit.quants as Q
from quantkit.formats.ggml_types import type_info
from quantkit.jit import get_threads, set_threads

TYPES = list(Q.TRAITS)


def _arbitrary_blocks(t, nrow, nblock, rng) -> np.ndarray:
    """Random bytes of ``nblock`` blocks a row, with what ``ggml_validate_row_data`` checks kept valid: the
    fp16 / float32 scales finite, MXFP4's E8M0 exponent below 0xFF, IQ1_M's fp16 scale (the top nibbles of
    its scales) finite; the float types random finite values."""
    info = type_info(t)
    if info.check == "values":
        x = (rng.standard_normal((nrow, nblock)) * 100).astype(np.float32)
        return np.ascontiguousarray(gguf.quants.quantize(x, t)).view(np.uint8).reshape(nrow, -1)
    y = rng.integers(0, 256, (nrow, nblock, info.type_size), dtype=np.uint8)
    for off in info.check_offsets:
        if info.check == "f16":
            y[:, :, off + 1] &= 0x7B  # exponent never all ones
        elif info.check == "f32":
            y[:, :, off + 3] &= 0x7F
            y[:, :, off + 2] &= 0x7F
        elif info.check == "e8m0":
            y[:, :, off] = np.minimum(y[:, :, off], 0xFE)
        elif info.check == "iq1_m":
            y[:, :, off + 7] &= 0xBF  # bit 14 of the fp16: the exponent is never all ones
    return y.reshape(nrow, nblock * info.type_size)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_equals_gguf_on_arbitrary_bytes(t):
    y = _arbitrary_blocks(t, 24, 2, np.random.default_rng(7))
    try:
        want = gguf.quants.dequantize(y, t)
    except NotImplementedError:
        pytest.skip(f"gguf-py cannot dequantize {t.name}")
    got = Q.dequantize(y, t)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_quantize_bytes_do_not_depend_on_the_thread_count(t):
    rng = np.random.default_rng(7)
    codec = Q.traits(t)
    n = 512  # a multiple of every block size
    x = (rng.standard_t(3, (40, n)) * 0.05).astype(np.float32)
    x[1] = 0.0
    w = rng.uniform(0.1, 2.0, n).astype(np.float32)
    ways = ([None] if not codec.requires_imatrix else []) + ([w] if codec.uses_imatrix else [])
    before = get_threads()
    try:
        set_threads(1)
        one = [Q.quantize(x, t, imatrix=i) for i in ways]
        set_threads(0)  # every core
        many = [Q.quantize(x, t, imatrix=i) for i in ways]
    finally:
        set_threads(before)
    assert ways and all(np.array_equal(a, b) for a, b in zip(one, many))
