"""Tests for the affine types (a scale and a minimum per block): Q4_1, Q5_1 (quantkit/quants/legacy.py), Q2_K,
Q4_K, Q5_K (quants/kquants.py).

* dequantize of the quantizer's output == gguf.quants.dequantize, float32 bit patterns compared (on
  arbitrary bytes, and 1 thread == all threads: every codec's, tests/test_codecs.py);
* Q4_1/Q5_1 quantize without imatrix == gguf.quants.quantize (gguf-py's numpy reference);
* quantize == ggml, through SHA-256 digests of ggml's output on deterministic inputs. The digests
  were made with ``ggml_quantize_chunk`` from ``libggml-base.so`` 0.25.3 (llama-cpp-python 0.3.36);
  ``python tests/test_affine.py --regen <llama.cpp>/build/bin/libggml-base.so`` recomputes them (it needs
  that library, the reference llama.cpp's of docs/DEVELOPING.md; the tests don't);
* property tests on edge blocks.
"""

from __future__ import annotations

import hashlib
import sys

import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.errors import QuantError
from quantkit.quants import TRAITS, dequantize, quantize

TYPES = [T.Q4_1, T.Q5_1, T.Q2_K, T.Q4_K, T.Q5_K]
LEGACY = [T.Q4_1, T.Q5_1]


def _row_len(qt, k=2):
    return k * TRAITS[qt].block_size


# -- deterministic inputs (integer hashing + exact float ops: identical on every platform) ----------

def _hash_u24(n, seed):
    i = np.arange(n, dtype=np.uint64)
    h = i * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed * 0x632BE59BD9B4E019 + 1)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    a = ((h >> np.uint64(40)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)
    b = ((h >> np.uint64(8)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)
    return a, b


def det_inputs(n, seed=0):
    """32 rows of ``n`` values covering the edge cases; every value is an exact float32 result."""
    a, b = _hash_u24(32 * n, seed)
    a = a.reshape(32, n)
    b = b.reshape(32, n)
    base = (a - np.float32(0.5)) / (b + np.float32(0.0625))  # heavy-tailed, correctly rounded
    x = base.copy()
    x[0] = 0
    x[1] = np.float32(0.75)
    x[2] = np.float32(-3.5)
    x[3] = 0
    x[3, n // 3] = np.float32(7.25)
    x[4] = base[4] * np.float32(2.0**-100)  # ~1e-30
    x[5] = base[5] * np.float32(2.0**14)  # beyond the fp16 range in places
    x[6] = a[6] * np.float32(6.0e4) - np.float32(3.0e4)
    x[7] = np.abs(base[7]) + np.float32(0.125)
    x[8] = -np.abs(base[8]) - np.float32(0.125)
    x[9] = np.floor(base[9] * np.float32(4.0)) * np.float32(0.25)  # exact grid
    x[10] = np.floor(a[10] * np.float32(16.0)) * np.float32(0.125)
    x[11] = base[11] * (b[11] < np.float32(0.1))  # sparse
    x[12] = base[12] * np.float32(2.0**-140)  # subnormal
    x[13] = np.where(a[13] < np.float32(0.5), np.float32(0.0), base[13])
    for r in range(14, 32):  # blocks of very different magnitudes within one row
        x[r] = base[r] * np.float32(2.0 ** ((r * 5) % 23 - 11))
        x[r, : n // 2] *= np.float32(2.0**-9)
    return x


def det_imatrix(n, seed=1):
    a, b = _hash_u24(n, seed)
    w = a * a * np.float32(8.0)
    w[b < np.float32(0.2)] = 0  # imatrix with zeros
    return w


def _digest(qt, with_imatrix):
    n = 512 if qt not in LEGACY else 96
    x = det_inputs(n)
    w = det_imatrix(n) if with_imatrix else None
    return x, w


# ggml's output on det_inputs, as SHA-256 hex (see the module docstring for how they were made).
GGML_DIGESTS = {
    ("Q4_1", False): "ea512a48ec654c19b8e18f078a9200f1828a66c0f456f06d822eefdc71fbdfa7",
    ("Q4_1", True): "2d39febfdc8f591c3f67b7ff3d6eaa14199ad8e619b3b63a4b174c8170459e11",
    ("Q5_1", False): "a293cec04483702055fbc94ad38cb4275917f8e20a4930e5b48a6a9d8955ff0b",
    ("Q5_1", True): "593cc4b8d55506a510767a692899d283a3c0ea52eb583f34a9b1a266cd26a806",
    ("Q2_K", False): "187c7abda1bf308b3d1b3ba2263bea9ce60017f3981b4597c8f4b70069b65208",
    ("Q2_K", True): "2fef10ef77c26c16cb6b96ddcf61242a4c1ee2686e38329aee080290c88e5531",
    ("Q4_K", False): "3d3e964b2b351d19202ade1a4639c1c617a18ab2465f10e3d02730ddb3671f7d",
    ("Q4_K", True): "1b3c76f1db32254178f91bf673fa2f7700db07fb7e1ad494477a98348d0a2698",
    ("Q5_K", False): "55616adfcce01608fb8422d818cb8e0112ac722a3e73293b198c78cc83cffe5c",
    ("Q5_K", True): "d03d4f87a0474857f096cebd9f80a7284e5d0ce99b694c141ba94768c501098b",
}


@pytest.mark.parametrize("with_imatrix", [False, True], ids=["ref", "imatrix"])
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_quantize_matches_ggml_digest(qt, with_imatrix):
    x, w = _digest(qt, with_imatrix)
    got = hashlib.sha256(quantize(x, qt, w).tobytes()).hexdigest()
    assert got == GGML_DIGESTS[(qt.name, with_imatrix)]


# -- registry ------------------------------------------------------------------------------------

@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_uses_imatrix(qt):
    # sizes: every codec against its row, tests/test_type_record.py
    assert TRAITS[qt].uses_imatrix


# -- dequantize == gguf-py (on arbitrary bytes: tests/test_codecs.py) -------------------------------

@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_dequantize_of_quantizer_output_matches_gguf(qt):
    # on the quantizer's output, with and without imatrix
    x = det_inputs(_row_len(qt))
    x = x[np.abs(x).max(axis=1) < 6e4]
    for w in (None, det_imatrix(x.shape[1])):
        q = quantize(x, qt, w)
        np.testing.assert_array_equal(dequantize(q, qt).view(np.uint32),
                                      gguf.quants.dequantize(q, qt).view(np.uint32))


# -- Q4_1 / Q5_1 quantize == gguf-py ----------------------------------------------------------------

@pytest.mark.parametrize("n", [32, 64, 256])
@pytest.mark.parametrize("qt", LEGACY, ids=lambda t: t.name)
def test_legacy_quantize_matches_gguf(qt, n):
    rng = np.random.default_rng(n)
    x = np.concatenate([
        rng.standard_normal((16, n)),
        rng.standard_t(2, (16, n)),
        np.zeros((2, n)),
        np.full((2, n), -1.25),
        rng.uniform(-6.4e4, 6.4e4, (4, n)),
        np.abs(rng.standard_normal((4, n))),
        rng.integers(-8, 8, (4, n)) * 0.5,
        rng.standard_normal((4, n)) * 1e-30,
    ]).astype(np.float32)
    np.testing.assert_array_equal(quantize(x, qt), gguf.quants.quantize(x, qt))


# -- threads ----------------------------------------------------------------------------------------

# -- properties on edge blocks ------------------------------------------------------------------------

_EDGE = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, -1e-30, 1e-40, 6.0e4, -6.0e4, 65504.0, 3.0, -7.0])
_ANY = st.floats(min_value=-6.0e4, max_value=6.0e4, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def _rows(draw, qt):
    n = TRAITS[qt].block_size
    kind = draw(st.sampled_from(["edge", "any", "const", "outlier"]))
    if kind == "edge":
        v = draw(st.lists(_EDGE, min_size=n, max_size=n))
    elif kind == "any":
        v = draw(st.lists(_ANY, min_size=n, max_size=n))
    elif kind == "const":
        v = [draw(_ANY)] * n
    else:
        v = [0.0] * n
        v[draw(st.integers(0, n - 1))] = draw(_ANY)
    return np.asarray(v, dtype=np.float32)


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_edge_blocks(qt):
    @settings(max_examples=40, deadline=None)
    @given(row=_rows(qt), use_w=st.booleans())
    def check(row, use_w):
        w = np.linspace(0, 2, row.shape[0], dtype=np.float32) if use_w else None
        batch = np.stack([row, row[::-1].copy(), np.zeros_like(row)])
        q = quantize(batch, qt, w)
        # rows are independent: quantizing a row alone gives the same bytes
        np.testing.assert_array_equal(q[0], quantize(row, qt, w))
        deq = dequantize(q, qt)
        if not np.isfinite(deq).all():
            # ggml does the same: with weights, the min search can step past -65504 for a block spanning
            # most of the fp16 range, and the fp16 min becomes -inf (test_q4_1_fp16_overflow_is_ggmls);
            # quantize refuses such output as llama-quantize's row validation does
            assert use_w and np.abs(row).max() > 3.0e4, row
        np.testing.assert_array_equal(deq[2], np.zeros_like(row))
        if qt in LEGACY and not use_w:  # gguf-py takes min/max with numpy, blind to the sign of zero
            plus_zero = batch + np.float32(0.0)
            np.testing.assert_array_equal(quantize(plus_zero, qt), gguf.quants.quantize(plus_zero, qt))

    check()


# -- errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_bad_input_raises_quant_error(qt):
    bs = TRAITS[qt].block_size
    with pytest.raises(QuantError, match="block size"):
        quantize(np.zeros((2, bs + 16), np.float32), qt)
    x = np.zeros((2, bs), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(QuantError, match="NaN"):
        quantize(x, qt)
    with pytest.raises(QuantError, match="imatrix"):
        quantize(np.zeros((2, bs), np.float32), qt, np.ones(bs + 1, np.float32))
    with pytest.raises(QuantError, match="bytes per row"):
        dequantize(np.zeros((2, TRAITS[qt].type_size + 1), np.uint8), qt)


# -- regenerating the digests (development only; needs the reference llama.cpp's libggml-base.so) ---

def _regen(lib_path):  # pragma: no cover
    import ctypes

    lib = ctypes.CDLL(lib_path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    for qt in TYPES:
        for with_imatrix in (False, True):
            x, w = _digest(qt, with_imatrix)
            bs, ts = gguf.GGML_QUANT_SIZES[qt]
            out = np.zeros((x.shape[0], x.shape[1] // bs * ts), np.uint8)
            lib.ggml_quantize_chunk(int(qt), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                                    None if w is None else w.ctypes.data)
            print(f"    ({qt.name!r}, {with_imatrix}): {hashlib.sha256(out.tobytes()).hexdigest()!r},")


if __name__ == "__main__":  # pragma: no cover
    if "--regen" in sys.argv:
        if not sys.argv[-1].endswith(".so"):
            sys.exit("usage: python tests/test_affine.py --regen <llama.cpp>/build/bin/libggml-base.so")
        _regen(sys.argv[-1])


def test_q4_1_fp16_overflow_is_ggmls():
    """The weighted Q4_1 search can overflow the fp16 min on a block spanning most of the fp16 range;
    ggml writes the same -inf. Reference bytes from libggml-base 0.25.3 (llama-cpp-python 0.3.36):
    ggml_quantize_chunk(Q4_1, x, y, 0, 2, 32, w) with the rows and weights below."""
    row = np.zeros(32, np.float32)
    row[10], row[22], row[30], row[31] = -60000.0, 65504.0, 60000.0, 60000.0
    x = np.stack([row, row[::-1].copy()])
    w = np.linspace(0, 2, 32, dtype=np.float32)
    ggml = ["ca7000fc888888888888f888888882888888e8e8", "1d7039fb7e7e777777077777777f777777777777"]
    q = quantize(x, T.Q4_1, w)
    assert [r.tobytes().hex() for r in q] == ggml
    assert np.isinf(dequantize(q, T.Q4_1)[0]).any() and np.isfinite(dequantize(q, T.Q4_1)[1]).all()
