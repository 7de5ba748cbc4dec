"""Kernels: matmul (decode and prefill, every variant) vs a float64 product of gguf's dequantization,
get_rows exact, activation quantizers vs ggml's reference, 1 thread == 2 threads byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from quantkit import isa
from quantkit import kernels as K
from quantkit import quants as Q
from quantkit.errors import QuantError
from quantkit.formats.ggml_types import type_info
from quantkit.jit import frozen, get_threads, set_threads
from quantkit.kernels.activations import FLOAT_KINDS

LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


def f16_fields(t):
    """Byte offsets of the fp16 scale fields (the type table's), for building random but valid K / IQ blocks."""
    return type_info(t).check_offsets
ALL = K.WEIGHT_TYPES
VARIANTS = list(K.RUNNABLE_VARIANTS)


def make_weights(t, n_out, n_in, seed=0):
    """Raw bytes (n_out, row_bytes) of type t: gguf's quantizer where it has one, else random blocks;
    read-only, as the file's map gives weights (so the kernels' builds for the file serve the tests)."""
    return frozen(_make_weights(t, n_out, n_in, seed))


def _make_weights(t, n_out, n_in, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_out, n_in)).astype(np.float32)
    if t == T.F32:
        return x.view(np.uint8)
    if t == T.F16:
        return x.astype(np.float16).view(np.uint8)
    if t == T.BF16 or t in LEGACY or t == T.MXFP4:  # MXFP4: random exponent bytes would overflow
        return np.ascontiguousarray(gq.quantize(x, t))
    bs, ts = GGML_QUANT_SIZES[t]
    nb = n_in // bs
    raw = rng.integers(0, 256, size=(n_out, nb, ts), dtype=np.uint8)
    for pos in f16_fields(t):
        d = (rng.uniform(0.002, 0.02, size=(n_out, nb)) * rng.choice([-1, 1], size=(n_out, nb)))
        if len(f16_fields(t)) == 2 and pos == f16_fields(t)[1]:
            d = np.abs(d)  # dmin
        raw[:, :, pos:pos + 2] = d.astype(np.float16).view(np.uint8).reshape(n_out, nb, 2)
    if type_info(t).check == "iq1_m":  # its fp16 scale is the scale words' top nibbles: keep it finite and small
        sc = type_info(t).field("scales")
        raw[:, :, sc + 7] = (raw[:, :, sc + 7] & 0x0F) | 0x10  # bits 12-15: sign 0, exponent 0b001xx
    return raw.reshape(n_out, nb * ts)


def ref_dequantize(w, t):
    """gguf-py's dequantization, or quantkit's where gguf-py has none (Q1_0 in gguf 0.19; checked against
    ggml's to_float in test_golden_lowbit.py)."""
    try:
        return gq.dequantize(w, t)
    except NotImplementedError:
        return Q.dequantize(w, t)


def n_in_for(t, wide=False):
    bs = GGML_QUANT_SIZES[t][0]
    if bs in (128, 256):
        return 768 if wide else 512
    return 576


def rel_err(y, ref):
    return float(np.sqrt(np.mean((y - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))


def tolerance(t, path):
    """Relative error vs a float64 product on unrounded activations. Both paths round activations to
    the weight type's vec_dot type as ggml does: F16 (11-bit mantissa), BF16 (8-bit), Q8_x (8-bit)."""
    if t == T.F32:
        return 2e-6
    if t == T.F16:
        return 3e-4
    if t == T.BF16:
        return 3e-3
    return 0.02  # 8-bit activations: ~0.5-1% of the output RMS


@pytest.fixture(autouse=True)
def _restore_threads():
    n = get_threads()
    yield
    set_threads(n)


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 3, 40])
def test_matmul_vs_float64(t, n_tok):
    n_in = n_in_for(t, wide=n_tok == 3)
    n_out = 37  # not a multiple of CHUNK_ROWS
    w = make_weights(t, n_out, n_in, seed=n_tok)
    x = np.random.default_rng(1).standard_normal((n_tok, n_in)).astype(np.float32)
    ref = x.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
    y = K.matmul(w, t, x)
    assert y.shape == (n_tok, n_out) and y.dtype == np.float32
    path = "prefill" if n_tok >= K.PREFILL_MIN_TOKENS else "decode"
    assert rel_err(y, ref) < tolerance(t, path), (t.name, path, rel_err(y, ref))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_variants_agree(t, variant):
    """Every kernel variant (vnni IR, generic IR, plain numba) against float64."""
    n_in = n_in_for(t)
    w = make_weights(t, 21, n_in, seed=5)
    x = np.random.default_rng(2).standard_normal((2, n_in)).astype(np.float32)
    ref = x.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
    kind = K.activation_kind(t, variant)
    out = np.empty((2, 21), np.float32)
    K.matvec_kernel(t, variant)(frozen(w), *K.quantize_activations(x, kind), out, 4)
    tol = 0.02 if kind not in FLOAT_KINDS else (2e-6 if variant == "plain" else tolerance(t, "decode"))
    assert rel_err(out, ref) < tol, (variant, rel_err(out, ref))


def q8_1_min_term_shift(w, t, kind, qs, d, s):
    """(n_tok, n_out) float64: what ggml's Q4_1 / Q5_1 dot adds over the exact dequantized product, its
    min term taking Q8_1's stored fp16 s in place of d * sum(qs); zeros for other activation kinds."""
    if kind != "Q8_1":
        return np.zeros((qs.shape[0], w.shape[0]))
    bs = 20 if t == T.Q4_1 else 24
    m = w.reshape(w.shape[0], -1, bs)[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)
    exact = d.astype(np.float64) * qs.reshape(qs.shape[0], -1, 32).astype(np.float64).sum(-1)
    return (s.astype(np.float64) - exact) @ m.T


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "plain"])
@pytest.mark.parametrize("t", [t for t in ALL if K.activation_kind(t, "generic") not in FLOAT_KINDS], ids=lambda t: t.name)
def test_integer_dot_exact(t, variant):
    """The integer path equals the exact sum of dequantized weight x dequantized activation, up to
    float32 accumulation (so any bit-unpacking slip shows)."""
    n_in = n_in_for(t)
    w = make_weights(t, 5, n_in, seed=9)
    x = np.random.default_rng(3).standard_normal((1, n_in)).astype(np.float32)
    kind = K.activation_kind(t, variant)
    qs, d, s = K.quantize_activations(x, kind)
    per = 256 if kind == "Q8_K" else 32
    xdeq = (qs.astype(np.float64).reshape(1, -1, per) * d.astype(np.float64)[:, :, None]).reshape(1, -1)
    ref = xdeq @ ref_dequantize(w, t).astype(np.float64).T + q8_1_min_term_shift(w, t, kind, qs, d, s)
    out = np.empty((1, 5), np.float32)
    K.matvec_kernel(t, variant)(frozen(w), qs, d, s, out, 16)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [2, 40])
def test_threads_identical(t, n_tok):
    n_in = n_in_for(t)
    w = make_weights(t, 70, n_in, seed=4)
    x = np.random.default_rng(4).standard_normal((n_tok, n_in)).astype(np.float32)
    set_threads(1)
    y1 = K.matmul(w, t, x)
    set_threads(2)
    y2 = K.matmul(w, t, x)
    np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_get_rows_exact(t):
    n_in = n_in_for(t)
    w = make_weights(t, 33, n_in, seed=6)
    ids = np.array([0, 32, 7, 7, 12])
    ref = ref_dequantize(w, t)[ids]
    np.testing.assert_array_equal(K.get_rows(w, t, ids), ref)


def test_readonly_memmap(tmp_path):
    t = T.Q8_0
    w = make_weights(t, 40, 576)
    p = tmp_path / "w.bin"
    w.tofile(p)
    mm = np.memmap(p, dtype=np.uint8, mode="r", shape=w.shape)
    x = np.random.default_rng(0).standard_normal((1, 576)).astype(np.float32)
    np.testing.assert_array_equal(K.matmul(mm, t, x), K.matmul(w, t, x))
    np.testing.assert_array_equal(K.get_rows(mm, t, [3]), K.get_rows(w, t, [3]))


def test_out_argument_and_errors():
    w = make_weights(T.Q4_0, 8, 64)
    x = np.ones((1, 64), np.float32)
    out = np.zeros((1, 8), np.float32)
    assert K.matmul(w, T.Q4_0, x, out=out) is out
    with pytest.raises(QuantError):
        K.matmul(w, T.Q4_0, np.ones((1, 32), np.float32))
    with pytest.raises(QuantError):
        K.matmul(w[:, :17], T.Q4_0, x)
    with pytest.raises(QuantError):
        K.get_rows(w, T.Q4_0, [8])


ACT_GOLDEN = np.load(Path(__file__).parent / "data" / "golden" / "activations.npz")


@pytest.mark.parametrize("kind", ["Q8_0", "Q8_1", "Q8_K"])
def test_activations_match_ggml_cpu(kind):
    """Bytes equal ggml's CPU from_float for the vec_dot types (tools/make_activation_golden.py)."""
    x = ACT_GOLDEN["x"]
    qs, d, s = K.quantize_activations(x, kind)
    packed = {"Q8_0": lambda: K.pack_q8_0(qs, d), "Q8_1": lambda: K.pack_q8_1(qs, d, s),
              "Q8_K": lambda: K.pack_q8_k(qs, d, s)}[kind]()
    want = ACT_GOLDEN[kind]
    assert packed.shape == want.shape
    diff = np.argwhere(packed != want)
    assert diff.size == 0, f"{len(diff)} bytes differ, first at (row, byte) {tuple(diff[0])}"


def test_q8_0_activation_sums():
    x = np.random.default_rng(7).standard_normal((3, 576)).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block
    qs, d, s = K.quantize_activations(x, "Q8_0")
    np.testing.assert_array_equal(s, qs.reshape(3, -1, 32).astype(np.int32).sum(-1))
    assert (d[1, 0] == 0) and not qs[1, :32].any()


def test_q8_k_activations():
    x = np.random.default_rng(8).standard_normal((2, 512)).astype(np.float32)
    x[1, 256:] = 0.0
    qs, d, s = K.quantize_activations(x, "Q8_K")
    assert qs.min() >= -127
    np.testing.assert_array_equal(s, qs.reshape(2, -1, 16).astype(np.int32).sum(-1))
    back = (qs.reshape(2, 2, 256) * d[:, :, None]).reshape(2, 512)
    assert np.abs(back - x).max() <= np.abs(x).max() / 127 * 0.51 + 1e-7
    packed = K.pack_q8_k(qs, d, s)
    assert packed.shape == (2, 2 * 292)
    assert np.frombuffer(packed[0, :4].tobytes(), "<f4")[0] == d[0, 0]


def test_vec_dot_type_table():
    for t in ALL:
        assert t in K.VEC_DOT_TYPE
    assert K.VEC_DOT_TYPE[T.Q4_1] == T.Q8_1 and K.VEC_DOT_TYPE[T.IQ4_XS] == T.Q8_K


@pytest.mark.parametrize("level", [*isa.buildable(), "plain"])
def test_env_switches_variant(monkeypatch, level):
    """Every level the host runs (and the plain kernels) is reachable through QUANTKIT_KERNELS, and
    matmul stays correct under it."""
    monkeypatch.setenv("QUANTKIT_KERNELS", level)
    want = "plain" if level == "plain" else isa.BY_NAME[level].variant
    assert K.default_variant() == want
    for t in (T.Q4_K, T.Q5_0):
        n_in = n_in_for(t)
        w = make_weights(t, 19, n_in, seed=11)
        x = np.random.default_rng(12).standard_normal((2, n_in)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
        assert rel_err(K.matmul(w, t, x), ref) < (2e-6 if want == "plain" else 0.02)


@pytest.mark.skipif(not K.HAS_VNNI, reason="needs VNNI")
def test_opt_in_512_bit_pairs():
    """QUANTKIT_512=1 (read at import) switches the 32-block types to 512-bit pairs; same results
    within the 8-bit tolerance, odd block counts (remainder loop) included."""
    import subprocess
    import sys
    code = """
import numpy as np, sys
sys.path.insert(0, %r)
from test_kernels import make_weights, ref_dequantize, rel_err
from gguf import GGMLQuantizationType as T
from gguf import quants as gq
from quantkit import isa
from quantkit import kernels as K
from quantkit.kernels import ir
assert ir.PAIRS_512 == ir.HAS_VNNI512
for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL):
    for n_in in (576, 608):
        w = make_weights(t, 9, n_in, seed=3)
        x = np.random.default_rng(4).standard_normal((2, n_in)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
        assert rel_err(K.matmul(w, t, x), ref) < 0.02, t
print("ok")
""" % str(__import__("pathlib").Path(__file__).parent)
    import os
    env = dict(os.environ, QUANTKIT_512="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


@pytest.mark.skipif(not K.ir.HAS_VNNI512, reason="no 512-bit VNNI on this CPU")
def test_k_quant_512_bit_pairs_identical():
    """The super-block dots with 512-bit chunk pairs (default where the CPU has AVX512-VNNI) give the
    same bits as the 256-bit loop (QUANTKIT_K512=0, read at import), 1- and 2-row dots alike."""
    import os
    import subprocess
    import sys
    code = """
import numpy as np, sys
sys.path.insert(0, %r)
from test_kernels import make_weights
from gguf import GGMLQuantizationType as T
from quantkit import isa
from quantkit import kernels as K
for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS):
    for n_out in (7, 8):
        w = make_weights(t, n_out, 768, seed=6)
        x = np.random.default_rng(7).standard_normal((1, 768)).astype(np.float32)
        sys.stdout.write(K.matmul(w, t, x).tobytes().hex() + "\\n")
""" % str(__import__("pathlib").Path(__file__).parent)
    outs = []
    for flag in ("1", "0"):
        env = dict(os.environ, QUANTKIT_K512=flag)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") == 12


def test_q8_1_activations():
    x = np.random.default_rng(9).standard_normal((2, 576)).astype(np.float32)
    q0, d0, s0 = K.quantize_activations(x, "Q8_0")
    q1, d1, s1 = K.quantize_activations(x, "Q8_1")
    np.testing.assert_array_equal(q1, q0)
    np.testing.assert_array_equal(d1, d0)
    assert s1.dtype == np.float32
    # ggml's s is fp16(d * sum) from the unrounded d: equal to d0 * sum within fp16 rounding
    np.testing.assert_allclose(s1, d0 * s0.astype(np.float32), rtol=2e-3, atol=1e-6)
    np.testing.assert_array_equal(s1, s1.astype(np.float16).astype(np.float32))


def test_half_rounding_of_activations_is_ggmls():
    """The F16/BF16 activation rounding (GEMV kinds and the prefill's parallel kernel) equals numpy's
    fp16 cast and ggml's fp32 -> bf16 (nearest even), including overflow to inf and tiny values."""
    from quantkit.kernels.activations import round_bf16_into, round_f16_into, round_half_rows

    rng = np.random.default_rng(11)
    x = (rng.standard_normal((37, 96)) * np.float32(300)).astype(np.float32)
    x[0, :6] = [65519.0, 65520.0, 7e4, -7e4, 1e-8, 0.0]
    with np.errstate(over="ignore"):
        want16 = x.astype(np.float16).astype(np.float32)
    u = x.view(np.uint32)
    want_bf = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)).view(np.float32)
    for bf16, want in ((False, want16), (True, want_bf)):
        out = np.empty_like(x)
        round_half_rows(x, out, bf16)
        assert np.array_equal(out, want)
        one = np.empty_like(x)
        (round_bf16_into if bf16 else round_f16_into)(x, one)
        assert np.array_equal(one, want)


@pytest.mark.parametrize("t", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_row_dot_is_the_rounded_activations_product(t):
    """The float row dots (eight rows at a time, then single ones) multiply the weights with the
    activations rounded once to the vec_dot type: float64's product of those two, to float32
    accumulation, over wide (8192) and narrow rows, and the same bytes at 1 and 2 threads."""
    for n_in in (576, 8192):
        w = make_weights(t, 19, n_in, seed=n_in)
        x = (np.random.default_rng(n_in).standard_normal((2, n_in)) * 3).astype(np.float32)
        xr = x
        if t == T.F16:
            xr = x.astype(np.float16).astype(np.float32)
        elif t == T.BF16:  # ggml's fp32 -> bf16, nearest even
            u = x.view(np.uint32)
            xr = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)).view(np.float32)
        ref = xr.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
        acts = K.quantize_activations(x, K.activation_kind(t))
        outs = []
        for n in (1, 2):
            set_threads(n)
            outs.append(np.empty((2, 19), np.float32))
            K.matvec_kernel(t)(frozen(w), *acts, outs[-1], 16)  # 16 rows: two calls of eight, then 3 rows
        assert outs[0].tobytes() == outs[1].tobytes()
        np.testing.assert_allclose(outs[0], ref, rtol=0, atol=2e-6 * np.sqrt(n_in) * np.abs(ref).max())


@pytest.mark.parametrize("kind,name,per", [(1, "Q8_0", 32), (2, "Q8_K", 256)])
def test_prefill_round_trip_is_quantize_then_decode(kind, name, per):
    """The prefill's vectorized activation round trip gives exactly q * d of the activation quantizer
    (itself checked against ggml's bytes), at 1 and 2 threads: all-zero blocks, +-ties for the
    largest |x| (Q8_K keeps the first), values spanning many binades."""
    from quantkit.kernels.activations import quantize_activations, round_trip_q8_into

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((41, 512)) * np.exp(2 * rng.standard_normal((41, 512)))).astype(np.float32)
    x[1, 32:64] = 0
    x[2, 256:] = 0
    x[3, 10], x[3, 20] = -1e3, 1e3
    x[4, 300], x[4, 301] = 77.0, -77.0
    qs, d, _ = quantize_activations(x, name)
    want = qs.astype(np.float32) * np.repeat(d, per, axis=1)
    before = get_threads()
    try:
        for n in (1, 2):
            set_threads(n)
            out = np.full_like(x, np.nan)
            round_trip_q8_into(x, kind, out, 32)
            np.testing.assert_array_equal(out, want)
    finally:
        set_threads(before)


# -- a type with a codec but no fast kernel: the portable path ----------------------------------------
# Q8_K has a codec (it is the K-quants' activation type) and, as in ggml, no vec_dot of its own: it stands
# for any type whose integer dot is not written yet.

def _portable_weights(n_out, n_in, seed):
    x = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    w = Q.quantize(x, T.Q8_K)
    return w, Q.dequantize(w, T.Q8_K).astype(np.float64)


@pytest.mark.parametrize("n_tok", [1, 3, 40])
def test_portable_path_for_a_type_without_a_kernel(n_tok):
    """matmul (GEMV and prefill) and get_rows on Q8_K weights: the codec's row decoder and a float32 dot,
    against float64 on the same decoded weights (activations are not rounded on this path)."""
    assert T.Q8_K not in K.WEIGHT_TYPES and K.activation_kind(T.Q8_K) == "F32"
    w, wd = _portable_weights(37, 512, n_tok)
    x = np.random.default_rng(7).standard_normal((n_tok, 512)).astype(np.float32)
    y = K.matmul(w, T.Q8_K, x)
    assert rel_err(y, x.astype(np.float64) @ wd.T) < 2e-6
    np.testing.assert_array_equal(K.get_rows(w, T.Q8_K, [3, 0, 36]), wd[[3, 0, 36]].astype(np.float32))
    set_threads(1)
    y1 = K.matmul(w, T.Q8_K, x)
    set_threads(2)
    np.testing.assert_array_equal(y1, K.matmul(w, T.Q8_K, x))


def test_portable_row_dot_equals_fast_one_on_the_same_values():
    """The portable row dot of a type that has a fast one (Q4_K) equals, up to float32 accumulation, the
    product of its decoded weights with float32 activations -- the path any new type takes first."""
    from quantkit.kernels import vecdot

    w = make_weights(T.Q4_K, 9, 512, seed=3)
    x = np.random.default_rng(8).standard_normal((2, 512)).astype(np.float32)
    info = type_info(T.Q4_K)
    body = vecdot.build(vecdot.rowdot_deq, "Q4_K_deq_test", False, DEQ=K.deq_kernel(T.Q4_K),
                        TS=info.type_size, BS=info.block_size)
    from quantkit.kernels import runners

    run = runners.rows_runner("Q4_K_deq_test", "F32", body,
                              vecdot.build(vecdot.rowdot2_split, "Q4_K_deq_test", False, ROWDOT=body), 2)
    out = np.empty((2, 9), np.float32)
    runners.Bound(runners._matvec(True), run, 1)(w, *K.quantize_activations(x, "F32"), out, 4)
    ref = x.astype(np.float64) @ gq.dequantize(w, T.Q4_K).astype(np.float64).T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_type_without_a_codec_is_one_line_before_compute():
    w = np.zeros((4, 36), np.uint8)  # NVFP4: a type ggml has and quantkit has no codec for
    for call in (lambda: K.matmul(w, T.NVFP4, np.ones((1, 64), np.float32)), lambda: K.get_rows(w, T.NVFP4, [0]),
                 lambda: K.activation_kind(T.NVFP4)):
        with pytest.raises(QuantError, match="NVFP4") as ei:
            call()
        assert "\n" not in str(ei.value)


# -- the 8-row interleaved (x8) layout of the decode step (AVX512-VNNI CPUs) ---------------------------

X8 = sorted({t for v in VARIANTS for t in K.x8_types(v)})
#: the variants with x8 kernels on this host (vnni: 512-bit with AVX512-VNNI, 256-bit halves with
#: AVX-VNNI; avx2: 256-bit halves)
X8_VARIANTS = [v for v in VARIANTS if K.x8_types(v)]
needs_x8 = pytest.mark.skipif(not X8, reason="no AVX2: no x8 kernels")


#: the x8 layout as ir.py's comment states it: per type, the block's header fields (offset, bytes,
#: element bytes) and its quant bytes (start, end)
X8_HEADERS = {T.Q8_0: (((0, 2, 2),), (2, 34)), T.Q4_0: (((0, 2, 2),), (2, 18)),
              T.Q4_1: (((0, 2, 2), (2, 2, 2)), (4, 20)), T.IQ4_NL: (((0, 2, 2),), (2, 18)),
              T.Q5_0: (((0, 2, 2), (2, 4, 4)), (6, 22)), T.Q5_1: (((0, 2, 2), (2, 2, 2), (4, 4, 4)), (8, 24)),
              T.Q2_K: (((0, 16, 1), (80, 2, 2), (82, 2, 2)), (16, 80)),
              T.Q3_K: (((96, 12, 4), (108, 2, 2)), (0, 96)),
              T.Q4_K: (((0, 2, 2), (2, 2, 2), (4, 12, 4)), (16, 144)),
              T.Q5_K: (((0, 2, 2), (2, 2, 2), (4, 12, 4)), (16, 176)),
              T.Q6_K: (((192, 16, 1), (208, 2, 2)), (0, 192)),
              T.IQ4_XS: (((0, 2, 2), (2, 2, 2), (4, 4, 4)), (8, 136)), T.MXFP4: (((0, 1, 1),), (1, 17)),
              T.TQ2_0: (((64, 2, 2),), (0, 64)), T.TQ1_0: (((48, 4, 4), (52, 2, 2)), (0, 48))}


@needs_x8
def test_x8_types_known():
    assert set(X8) <= set(X8_HEADERS)


@needs_x8
@pytest.mark.parametrize("t", X8, ids=lambda t: t.name)
def test_pack_x8_layout(t):
    """Byte range [a, a + n) of a row's block -> [8a, 8a + 8n) of the 8-row group's block: header
    element k of row r at 8a + (8k + r) * e, quant slice j (bytes 8j..8j+7) of row r at 8a + 64j + 8r
    (ir.py's x8 layout), written out here byte by byte. Q6_K: its header first (scales at 0, d at 128),
    then from 144 its slices in the order its kernel first reads them: per half n, ql slice 8n + s and
    qh slice 16 + 4n + s for s = 0..3, then ql slices 8n + 4..8n + 7."""
    bs, ts = GGML_QUANT_SIZES[t]
    fields, (q0, q1) = X8_HEADERS[t]
    at = {a: 8 * a for a, _, _ in fields}
    slot = {j: 8 * q0 + 64 * j for j in range((q1 - q0) // 8)}
    if t == T.Q6_K:
        at = {192: 0, 208: 128}
        order = [0, 16, 1, 17, 2, 18, 3, 19, 4, 5, 6, 7, 8, 20, 9, 21, 10, 22, 11, 23, 12, 13, 14, 15]
        slot = {j: 144 + 64 * pos for pos, j in enumerate(order)}
    w = make_weights(t, 16, 3 * bs, seed=2)
    got = K.pack_x8(w, t)
    want = np.zeros((2, 8 * w.shape[1]), np.uint8)
    for g in range(2):
        for i in range(3):
            base = i * 8 * ts
            for r in range(8):
                row = w[8 * g + r, i * ts:(i + 1) * ts]
                for a, size, e in fields:
                    for k in range(size // e):
                        o = base + at[a] + (8 * k + r) * e
                        want[g, o:o + e] = row[a + k * e:a + (k + 1) * e]
                for j in range((q1 - q0) // 8):
                    o = base + slot[j] + 8 * r
                    want[g, o:o + 8] = row[q0 + 8 * j:q0 + 8 * j + 8]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        K.pack_x8(w[:12], t)


@needs_x8
@pytest.mark.parametrize("variant", X8_VARIANTS)
@pytest.mark.parametrize("t", X8, ids=lambda t: t.name)
def test_x8_dot_exact(t, variant):
    """The x8 GEMV equals the exact sum of dequantized weight x dequantized activation up to float32
    accumulation (as test_integer_dot_exact), and the file-rows GEMV up to summation order."""
    n_in, n_out = 2048, 48
    w = make_weights(t, n_out, n_in, seed=11)
    x = np.random.default_rng(5).standard_normal((2, n_in)).astype(np.float32)
    x[:, ::97] *= 30  # outliers, as real activations have
    kind = K.activation_kind(t)
    qs, d, s = K.quantize_activations(x, kind)
    per = 256 if kind == "Q8_K" else 32
    xdeq = (qs.astype(np.float64).reshape(2, -1, per) * d.astype(np.float64)[:, :, None]).reshape(2, -1)
    ref = xdeq @ gq.dequantize(w, t).astype(np.float64).T + q8_1_min_term_shift(w, t, kind, qs, d, s)
    got = np.empty((2, n_out), np.float32)
    K.matvec_x8_kernel(t, variant=variant)(K.pack_x8(w, t), qs, d, s, got, 16)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    rows = np.empty((2, n_out), np.float32)
    K.matvec_kernel(t, variant)(frozen(w), qs, d, s, rows, 16)
    # MXFP4's row dot converts its 8 lanes to float before summing them, lane 0 holding -128 * sum(x)
    # and the others + 128 * theirs: against values of at most 12 that cancellation costs it ~5e-6 of
    # the largest output (the x8 dot sums its lanes as integers: 1e-7)
    tol = 1e-5 if t == T.MXFP4 else 2e-6
    np.testing.assert_allclose(got, rows, rtol=0, atol=tol * np.abs(ref).max())


@needs_x8
@pytest.mark.parametrize("variant", X8_VARIANTS)
@pytest.mark.parametrize("t", X8, ids=lambda t: t.name)
def test_x8_threads_identical(t, variant):
    n_in = n_in_for(t)
    w = K.pack_x8(make_weights(t, 64, n_in, seed=3), t)
    x = np.random.default_rng(6).standard_normal((1, n_in)).astype(np.float32)
    qs, d, s = K.quantize_activations(x, K.activation_kind(t))
    out = [np.empty((1, 64), np.float32) for _ in range(2)]
    for n, o in zip((1, 2), out):
        set_threads(n)
        K.matvec_x8_kernel(t, variant=variant)(w, qs, d, s, o, 16)
    np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.skipif("neon" not in X8_VARIANTS, reason="not an AArch64 CPU with the dot product (tools/arm64_tests.sh)")
@pytest.mark.parametrize("t", [T.Q4_0, T.Q8_0, T.IQ4_XS], ids=lambda t: t.name)
def test_neon_x8_dots_are_sdot(t):
    """The neon x8 dots' machine code multiplies with ``sdot`` (IQ4_XS's table looked up with ``tbl``),
    not LLVM's widening multiplies of generic IR, and gives the x8 GEMV's result."""
    import numba

    from quantkit.kernels.vecdot import rowx8_kernel
    row = rowx8_kernel(t, "neon")

    @numba.njit(cache=False)
    def one(wg, xq, xd, xs):
        return row(wg, xq, xd, xs)

    n_in = n_in_for(t)
    w = K.pack_x8(make_weights(t, 8, n_in, seed=9), t)
    qs, d, s = K.quantize_activations(np.random.default_rng(4).standard_normal((1, n_in)).astype(np.float32),
                                      K.activation_kind(t))
    got = np.array(one(w[0], qs[0], d[0], s[0]), np.float32)
    want = np.empty((1, 8), np.float32)
    K.matvec_x8_kernel(t, variant="neon")(w, qs, d, s, want, 16)
    assert got.tobytes() == want[0].tobytes()
    asm = one.inspect_asm(one.signatures[0])
    assert "sdot\t" in asm or "sdot " in asm
    if t == T.IQ4_XS:
        assert "tbl\t" in asm or "tbl " in asm


def _q8_k_reference(x: np.ndarray):
    """ggml's quantize_row_q8_K_ref (ggml-quants.c) for one row, in numpy float32: (qs, d, bsums)."""
    qs, d, bs = [], [], []
    for blk in x.reshape(-1, 256):
        amax, mx = np.float32(0), np.float32(0)
        for v in blk:
            if abs(v) > amax:  # NaN compares false: passed over
                amax, mx = abs(v), v
        if not amax:
            qs.append(np.zeros(256, np.int8))
            d.append(np.float32(0))
            bs.append(np.zeros(16, np.int32))
            continue
        with np.errstate(invalid="ignore", over="ignore"):  # subnormal max: iscale = -inf, as in C
            iscale = np.float32(-127.0) / mx
            bits = (iscale * blk + np.float32(12582912.0)).astype(np.float32).view(np.uint32)
        q = np.minimum(127, (bits & 0x7FFFFF).astype(np.int32) - 0x400000).astype(np.int8)
        qs.append(q)
        d.append(np.float32(1.0) / iscale)
        bs.append(q.reshape(16, 16).astype(np.int32).sum(1))
    return np.concatenate(qs), np.array(d, np.float32), np.concatenate(bs)


def test_q8_k_activations_edge_blocks():
    """The signed max is the first x of the largest |x| (+amax and -amax both present, either first),
    NaNs are passed over, and all-zero / all-NaN / -0.0 blocks give d = 0: as quantize_row_q8_K_ref."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 256 * 8)).astype(np.float32)
    b = x.reshape(8, 256)
    b[0, 10], b[0, 200] = -3.5, 3.5           # tie, negative first
    b[1, 5], b[1, 99] = 4.0, -4.0             # tie, positive first
    b[2, 7], b[2, 8] = np.nan, 5.0            # a NaN beside the max
    b[3] = np.nan                             # all NaN
    b[4] = -0.0                               # negative zeros
    b[5] = 0.0
    b[6, 255] = -9.0                          # the max last
    b[7, :] = np.float32(2.0 ** -140)         # subnormals only
    qs, d, s = K.quantize_activations(x, "Q8_K")
    wq, wd, ws = _q8_k_reference(x[0])
    np.testing.assert_array_equal(qs[0], wq)
    np.testing.assert_array_equal(d[0], wd)
    np.testing.assert_array_equal(s[0], ws)


@pytest.mark.parametrize("t", [T.F16, T.BF16, T.Q5_1], ids=lambda t: t.name)
def test_prefill_tiles_on_threads_when_blas_is_not_deterministic(t, monkeypatch):
    """Where BLAS's results would change with its thread count (OpenBLAS held to a foreign kernel),
    the prefill runs fixed tiles, one single-threaded BLAS call each, on its own threads: the same
    bytes at 1 and 2 threads, and the product of the float64 reference."""
    from quantkit.kernels import mul_mat as M

    monkeypatch.setattr(M, "blas_threads_deterministic", lambda: False)
    monkeypatch.setenv("QUANTKIT_GEMM", "0")
    n_in = n_in_for(t)
    w = make_weights(t, 300, n_in, seed=13)
    x = np.random.default_rng(14).standard_normal((K.PREFILL_MIN_TOKENS + 3, n_in)).astype(np.float32)
    outs = []
    for n in (1, 2):
        set_threads(n)
        outs.append(K.matmul(w, t, x))
    assert outs[0].tobytes() == outs[1].tobytes()
    ref = x.astype(np.float64) @ ref_dequantize(w, t).astype(np.float64).T
    assert rel_err(outs[1], ref) < tolerance(t, "prefill")
