"""The symmetric types Q4_0, Q5_0, Q8_0 (quantkit/quants/legacy.py), Q3_K, Q6_K, Q8_K (quants/kquants.py) and
their scale searches (quants/search.py): bytes against ggml (recorded hashes, made by
tools/make_digest_golden.py), quantize and dequantize against gguf-py, the scale searches' properties, edge
blocks and error messages (arbitrary bytes and thread-count independence: every codec's,
tests/test_codecs.py)."""

from __future__ import annotations

import hashlib

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quantkit.errors import QuantError
from quantkit.quants import TRAITS, dequantize, quantize
from quantkit.quants.search import make_q3_quants, make_qx_quants

T = gguf.GGMLQuantizationType
TYPES = ["Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q6_K", "Q8_K"]
LEGACY = ["Q4_0", "Q5_0", "Q8_0"]
GGUF_DEQUANT = ["Q4_0", "Q5_0", "Q8_0", "Q3_K", "Q6_K"]  # gguf-py 0.19 has no Q8_K
WEIGHTED = ["Q4_0", "Q5_0", "Q3_K", "Q6_K"]  # the types whose bytes depend on the imatrix


def golden_input(nrow: int, n: int) -> np.ndarray:
    """Deterministic rows from integer hashing and exact IEEE operations (portable bit for bit).

    Rows 0-11 are edge cases: 0 zeros, 1 constant, 2 one outlier in zeros, 3 values ~1e-30,
    4 near the fp16 maximum, 5 all positive, 6 all negative, 7 a grid of multiples of 0.25,
    8 zeros with a -0.0 first in every block, 9 subnormal float32 (the inverse scale overflows to
    inf), 10 power-of-two magnitudes that change every 16 values (2^-20 .. 2^20; ggml writes an
    fp16 inf as the d of some Q4_0/Q5_0 blocks), 11 sparse.
    The rest: uniform noise plus a heavy tail, a different spread per row.
    """
    i = np.arange(nrow * n, dtype=np.uint64).reshape(nrow, n)
    u = ((i * np.uint64(2654435761)) % np.uint64(2**32)).astype(np.float64) / 2.0**32
    v = ((i * np.uint64(40503) + np.uint64(12345)) % np.uint64(2**16)).astype(np.float64) / 2.0**16
    r = np.arange(nrow, dtype=np.float64)[:, None]
    x = (u - 0.5) * (1.0 + r % 7) + (v - 0.5) / (u + 0.01) * 0.01
    x[0] = 0.0
    x[1] = -1.5
    x[2] = 0.0
    x[2, 5] = 42.0
    x[3] *= 1e-30
    x[4] = np.clip(x[4] * 3e4, -65000, 65000)
    x[5] = np.abs(x[5])
    x[6] = -np.abs(x[6])
    x[7] = np.round(x[7] * 4) / 4
    x[8] = 0.0
    x[8, ::32] = -0.0
    x[9] *= 1e-39
    k = ((np.arange(n) // 16 * 7919) % 41 - 20).astype(np.float64)
    x[10] *= 2.0**k
    x[11] = np.where(v[11] < 0.1, x[11], 0.0)
    return x.astype(np.float32)


def golden_imatrix(n: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    h = ((i * np.uint64(2246822519) + np.uint64(7)) % np.uint64(1000)).astype(np.float64)
    w = (h / 250.0) ** 2
    w[::5] = 0.0  # zeros in the imatrix
    w[64:80] = 0.0  # and a whole 16-value group of them (one Q3_K/Q6_K sub-block)
    return w.astype(np.float32)


#: the rows of golden_input the digests below are taken over
GOLDEN_ROWS = 24
# sha256 of ggml_quantize_chunk(type, golden_input(GOLDEN_ROWS, n), NULL or golden_imatrix(n)) -- for
# Q8_K quantize_row_q8_K_ref into a zeroed buffer -- from libggml-base.so of llama-cpp-python 0.3.36
# (ggml 0.25.3, x86-64, via ctypes); quantkit's output was byte-identical when recorded.
# tools/make_digest_golden.py regenerates them from the real ggml.
GGML_SHA256 = {
    ("Q4_0", 64, False): "a672ae863f0200b6fac9335217aa291a33bd04b581846818f17bc32605e9dbd4",
    ("Q4_0", 64, True): "d9d83cdf987245e1ddb6eb1ffd0b53e13c8706a5b3bb8013d3de7154fcb34d70",
    ("Q4_0", 512, False): "17be748c5fbdb3ccd11359111469aa34c1d79af3a37007bf54c157301e5bf8fc",
    ("Q4_0", 512, True): "987b2c5f70b14ad29e29af5099496eb92c60da7fe2265abe098222abed8f0edb",
    ("Q5_0", 64, False): "8cd00a75835b9d77b5f8dff2cdd2ffdc2ca73ea7ba44ab4d30d2eb8f50f25899",
    ("Q5_0", 64, True): "bf21a2970bac0271cfd8902ee0381256dcac116b3f8a240ad1b387946a2263e0",
    ("Q5_0", 512, False): "f28d9bbece3d7d2465050470bf0dd5a69778ac5ddb711cf0343a6be4fbba3b64",
    ("Q5_0", 512, True): "5d4eca1fe3f673ca9bdb13ba6c8923e838cd31559e5d2b0bb812cc567d96b3a5",
    ("Q8_0", 64, False): "d50af629ec01bcb975584d84276a43b11fe0d6eaf879d4215aea947100356740",
    ("Q8_0", 512, False): "e112a4f90a5063d7ecbaf5e321e78fd3c09943095fe1fdcf30f1ef4d92e9619a",
    ("Q3_K", 256, False): "bc007387076681e874ff704d3b76faf973c77a43ea08e63b9c8f8a03823b8df7",
    ("Q3_K", 256, True): "44c921d8b72974a4dd49f67de1feb6674c4411cd901857b7b970d231f4bc149f",
    ("Q3_K", 512, False): "759dcbbede6dc7b9ac8c1eed53056709f8a8ea5db99325af040168e94000e522",
    ("Q3_K", 512, True): "6d75dd9d9b03b1824ca1e26a2cd7aa7230b3601780ca6f215294773606bd140b",
    ("Q6_K", 256, False): "eca90a50f1722fd81f272b159a3f855dde86a97a4b7a362816aa585fd432466f",
    ("Q6_K", 256, True): "9a60103f49b71ac7697b93c2a1619eaa54be8cdf4ca7477353409fb4677402d9",
    ("Q6_K", 512, False): "8757c2f76c4b1b663b83d650937f53cc2f174d014f2c08e18724935c9324831d",
    ("Q6_K", 512, True): "3ef6353c5b2cf6a7f8d44e8fb14000e2b416b9d06f5710a19ede3209ccf6780a",
    ("Q8_K", 256, False): "b02a072856c134f015d78da6fc369b658e99b5b4c5405098b8bb721312b76939",
    ("Q8_K", 512, False): "010ad3e98b06f6b90898cdd8d1a72a4a1a5274daf30b3177f8c003741757487a",
}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def plain(x: np.ndarray) -> np.ndarray:
    """x with -0.0 turned into +0.0 (gguf-py's argmax picks a -0.0 that ggml's scan never picks)."""
    return x + np.float32(0.0)


# -- registry ------------------------------------------------------------------------------------
def test_uses_imatrix_where_ggml_does():
    # sizes: every codec against its row, tests/test_type_record.py
    for name in TYPES:
        assert TRAITS[T[name]].uses_imatrix == (name in WEIGHTED)


# -- bytes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", sorted(GGML_SHA256), ids=lambda k: f"{k[0]}-{k[1]}-{'imat' if k[2] else 'ref'}")
def test_bytes_match_ggml(key):
    name, n, with_imatrix = key
    x = golden_input(GOLDEN_ROWS, n)
    q = quantize(x, name, imatrix=golden_imatrix(n) if with_imatrix else None)
    assert q.shape == (GOLDEN_ROWS, TRAITS[T[name]].row_bytes(n))
    assert hashlib.sha256(q.tobytes()).hexdigest() == GGML_SHA256[key]


@pytest.mark.parametrize("name", LEGACY)
@pytest.mark.parametrize("n", [32, 64, 512])
def test_legacy_quantize_matches_gguf(name, n):
    x = plain(golden_input(24, n))
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, T[name])
    assert np.array_equal(quantize(x, name), want)


def test_negative_zero_scale_as_ggml():
    # ggml scans for the first value of largest magnitude starting from +0.0, so an all-zero block
    # gets d = 0.0/-8 = -0.0 (fp16 0x8000) whatever the sign of its zeros; gguf-py takes the
    # block's first value (which may be -0.0) and writes +0.0 then.
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = -0.0
    for name, rest in [("Q4_0", 0x88), ("Q5_0", None)]:
        q = quantize(x, name)[0]
        assert q[:2].tolist() == [0x00, 0x80]
        if rest is not None:
            assert (q[2:] == rest).all()
    assert quantize(x, "Q5_0")[0, 2:6].tolist() == [0xFF] * 4  # all levels 16: fifth bit set
    assert not quantize(x, "Q8_0")[0].any()  # Q8_0 divides |max| by 127: +0.0


def test_zero_blocks_of_k_types():
    x = np.zeros((1, 256), np.float32)
    assert not quantize(x, "Q6_K").any()  # ggml clears the whole block
    assert not quantize(x, "Q8_K").any()  # d = 0, qs = 0 and (here) bsums = 0
    q3 = quantize(x, "Q3_K")[0]
    assert not q3[96:].any()  # scales and d are zero
    assert not dequantize(q3[None], "Q3_K").any()


# -- dequantization ------------------------------------------------------------------------------
def test_q8_k_layout_and_dequantize():
    x = golden_input(24, 512)
    q = quantize(x, "Q8_K").reshape(-1, 292)
    d = q[:, :4].copy().view(np.float32)
    qs = q[:, 4:260].view(np.int8).astype(np.int32)
    bsums = q[:, 260:].copy().view(np.int16)
    assert np.array_equal(bsums, qs.reshape(-1, 16, 16).sum(-1))
    assert (np.abs(qs) <= 127).all()
    assert same_bits(dequantize(q.reshape(24, -1), "Q8_K"), (d * qs.astype(np.float32)).reshape(24, 512))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("with_imatrix", [False, True])
def test_roundtrip_matches_gguf_and_is_close(name, with_imatrix):
    x = golden_input(24, 512)
    q = quantize(x, name, imatrix=golden_imatrix(512) if with_imatrix else None)
    y = dequantize(q, name)
    if name in GGUF_DEQUANT:
        with np.errstate(invalid="ignore"):  # row 10 overflows Q4_0/Q5_0's fp16 d to inf, as in ggml
            assert same_bits(y, gguf.quants.dequantize(q, T[name]))
    # rows 12.. are ordinary data: the rms error stays well below the rms value (3 bits: a third).
    # Columns 64:80 have all-zero weights, which may zero them (see test_zero_weight_group_...).
    keep = np.r_[0:64, 80:512]
    rel = {"Q3_K": 0.35, "Q4_0": 0.2, "Q5_0": 0.1, "Q6_K": 0.05, "Q8_0": 0.02, "Q8_K": 0.02}[name]
    err = np.sqrt(np.mean((y[12:, keep] - x[12:, keep]) ** 2, axis=1))
    assert (err < rel * np.sqrt(np.mean(x[12:, keep] ** 2, axis=1))).all()
    assert not y[0].any()
    # 1e-30 rows: an fp16 scale underflows to zero; Q8_K's float32 scale keeps them
    assert not y[3].any() if name != "Q8_K" else np.abs(y[3] - x[3]).max() <= np.abs(x[3]).max() / 127


def test_zero_weight_group_of_q6_k_comes_back_as_zeros():
    # ggml's quantize_row_q6_K_impl hands the imatrix straight to make_qx_quants: a group of 16
    # whose weights are all zero gets scale 0, so it dequantizes to zeros (the hashes above pin
    # that this is ggml's behaviour too). The reference path keeps it.
    x = golden_input(24, 256)[12:]
    w = golden_imatrix(256)
    assert not w[64:80].any()
    y = dequantize(quantize(x, "Q6_K", imatrix=w), "Q6_K")
    assert not y[:, 64:80].any() and ((y[:, 80:96] != 0).sum(1) >= 8).all()
    assert ((dequantize(quantize(x, "Q6_K"), "Q6_K")[:, 64:80] != 0).sum(1) >= 8).all()


# -- threads and experts -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Q4_0", "Q6_K"])
def test_expert_imatrix_uses_each_experts_row(name):
    x = golden_input(24, 256)[12:20].reshape(2, 4, 256)
    w = np.stack([golden_imatrix(256), golden_imatrix(256)[::-1].copy()])
    q = quantize(x, name, imatrix=w)
    assert np.array_equal(q[0], quantize(x[0], name, imatrix=w[0]))
    assert np.array_equal(q[1], quantize(x[1], name, imatrix=w[1]))


def test_imatrix_ignored_only_where_ggml_ignores_it():
    x = golden_input(24, 256)[12:]
    w = golden_imatrix(256)
    for name in TYPES:
        same = np.array_equal(quantize(x, name), quantize(x, name, imatrix=w))
        assert same == (name not in WEIGHTED), name


# -- the scale searches --------------------------------------------------------------------------
def _weighted_err(x, w, scale, L, nmax):
    q = scale * (L.astype(np.float64) - nmax)
    return float(np.sum(w * (x.astype(np.float64) - q) ** 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    vals=st.lists(st.floats(-100.0, 100.0, width=32), min_size=16, max_size=16),
    nmax=st.sampled_from([4, 8, 16, 32]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_make_qx_quants_search_never_loses_to_plain_rounding(vals, nmax, weighted, seed):
    """The returned levels and scale fit at least as well (weighted least squares) as the levels of
    plain rounding (rmse_type 0) with their own best scale; levels stay in [0, 2*nmax)."""
    x = np.array(vals, np.float32)
    w = (np.random.default_rng(seed).random(16) * 4).astype(np.float32) if weighted else x * x
    qw = w if weighted else np.zeros(0, np.float32)
    L = np.zeros(16, np.int8)
    scale = make_qx_quants(16, nmax, x, L, 1, qw)
    L0 = np.zeros(16, np.int8)
    make_qx_quants(16, nmax, x, L0, 0, qw)
    assert L.min() >= 0 and L.max() < 2 * nmax and L0.min() >= 0 and L0.max() < 2 * nmax
    if np.abs(x).max() < 1e-15:
        assert scale == 0 and not L.any()
        return
    l0 = L0.astype(np.float64) - nmax
    den = float(np.sum(w * l0 * l0))
    s0 = float(np.sum(w * x * l0)) / den if den > 0 else 0.0
    e_best, e_plain = _weighted_err(x, w, scale, L, nmax), _weighted_err(x, w, s0, L0, nmax)
    assert e_best <= e_plain + 1e-5 * float(np.sum(w * x.astype(np.float64) ** 2))


@settings(max_examples=40, deadline=None)
@given(vals=st.lists(st.floats(-10.0, 10.0, width=32), min_size=16, max_size=16))
@example(vals=[0.0] * 15 + [1e-15])  # failed once against the bound without its float32 underflow term
def test_make_q3_quants_levels_and_fit(vals):
    x = np.array(vals, np.float32)
    L = np.zeros(16, np.int8)
    scale = make_q3_quants(16, 4, x, L, True)
    assert L.min() >= 0 and L.max() <= 7
    L0 = np.zeros(16, np.int8)
    s0 = make_q3_quants(16, 4, x, L0, False)
    w = x.astype(np.float64) ** 2
    # ggml's search sums w * x * l = x^3 * l in float32: for a block whose largest value is under ~2e-13 those
    # products are subnormal (x^3 below float32's smallest normal, 1.2e-38), each rounded to a multiple of
    # 2**-149, so its scale can be off by n * 2**-149 / sum(w l^2) and its squared error larger by
    # (n * 2**-149)**2 / sum(w l^2) (fifteen 0.0 and one 1e-15: 1.6e-61, where 1e-5 * sum(w^2) is 1e-65)
    l = L.astype(np.float64) - 4
    den = float(np.sum(w * l * l))
    underflow = (16 * 2.0**-149) ** 2 / den if den > 0 else 0.0
    assert (_weighted_err(x, w, scale, L, 4)
            <= _weighted_err(x, w, s0, L0, 4) + 1e-5 * float(np.sum(w * w)) + underflow)


# -- edge blocks ---------------------------------------------------------------------------------
_edge_value = st.one_of(
    st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 1e-15, 1e-39, 6.5e4, -6.5e4, 65504.0, 1.0, -1.0]),
    st.floats(-65504.0, 65504.0, width=32),
    st.floats(-2.0**-10, 2.0**-10, width=32),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(TYPES),
    vals=st.lists(_edge_value, min_size=1, max_size=8),
    weights=st.one_of(st.none(), st.lists(st.sampled_from([0.0, 1e-20, 0.5, 3.0]), min_size=1, max_size=4)),
    seed=st.integers(0, 2**16),
)
def test_edge_blocks_are_consistent(name, vals, weights, seed):
    """Blocks of a few extreme values: the legacy types equal gguf-py's quantize, dequantization
    equals gguf-py's, and the output is finite and within the input's range (plus rounding)."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array(vals, np.float32), size=(2, 256)).astype(np.float32)
    w = None if weights is None else rng.choice(np.array(weights, np.float32), size=256).astype(np.float32)
    q = quantize(x, name, imatrix=w)
    y = dequantize(q, name)
    if name in GGUF_DEQUANT:
        assert same_bits(y, gguf.quants.dequantize(q, T[name]))
    if name in LEGACY and (w is None or name == "Q8_0"):
        with np.errstate(all="ignore"):
            assert np.array_equal(quantize(plain(x), name), gguf.quants.quantize(plain(x), T[name]))
    assert np.isfinite(y).all()
    assert (np.abs(y) <= 1.5 * np.abs(x).max() + 1e-6).all()


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize(np.zeros((2, 48), np.float32), "Q4_0"), "not a positive multiple of the block size 32"),
        (lambda: quantize(np.zeros((2, 128), np.float32), "Q6_K"), "block size 256"),
        (lambda: quantize(np.zeros((2, 128), np.float64), "Q8_0"), "float32"),
        (lambda: quantize(np.full((1, 256), np.inf, np.float32), "Q3_K"), "NaN/Inf"),
        (lambda: quantize(np.zeros((1, 256), np.float32), "Q5_0", imatrix=np.ones(32, np.float32)),
         "imatrix has 32 values"),
        (lambda: quantize(np.zeros((1, 256), np.float32), "Q8_K", imatrix=-np.ones(256, np.float32)), "negative"),
        (lambda: dequantize(np.zeros((1, 100), np.uint8), "Q6_K"), "210-byte block"),
    ],
)
def test_bad_input_raises_quant_error(call, message):
    with pytest.raises(QuantError, match=message):
        call()
