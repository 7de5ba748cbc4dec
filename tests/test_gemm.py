"""The prefill's integer GEMM (kernels/gemm.py) against a float64 product of the same integer math --
gguf's dequantized weights times the dequantized Q8 activations -- for every type it covers, on shapes
with partial row tiles and token groups; 1 thread == 2 threads byte for byte; its activations equal
the GEMV's quantizer's bytes; matmul routes batches to it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from quantkit import isa
from quantkit.formats.ggml_types import type_info
from quantkit import kernels as K
from quantkit.jit import get_threads, set_threads
from quantkit.kernels import gemm as G
from quantkit.kernels.cpu_traits import CPU_TRAITS, cpu_traits, kind_of
from quantkit.kernels.ir import RUNNABLE_VARIANTS, gemm_flavour, int8_flavour

from test_kernels import _restore_threads, make_weights, ref_dequantize  # noqa: F401 (autouse fixture)

#: the GEMM's flavours this host executes (vnni: 512-bit VNNI; avx2: any AVX2 CPU; neon: AArch64 with
#: the dot product; i8mm: and the int8 matrix multiply)
FLAVOURS = sorted({f for v in RUNNABLE_VARIANTS for f in (int8_flavour(v), gemm_flavour(v)) if f})
pytestmark = pytest.mark.skipif(not FLAVOURS, reason="the integer GEMM needs AVX2")
#: every type whose record has a GEMM entry
TYPES = [T[n] for n in CPU_TRAITS if kind_of(n, "gemm") == "gemm"]


def exact_reference(w, t, x):
    """float64 x_deq @ w_deq.T with x rounded to the type's activation kind (ggml's from_float); for
    Q8_1 the min term uses the stored fp16 ``s`` in place of d * sum(q), as ggml's vec_dot does."""
    kind = cpu_traits(t).gemm.act
    qs, d, s = K.quantize_activations(x, kind)
    per = 256 if kind == "Q8_K" else 32
    n = x.shape[0]
    xdeq = (qs.astype(np.float64).reshape(n, -1, per) * d.astype(np.float64)[:, :, None]).reshape(n, -1)
    ref = xdeq @ ref_dequantize(w, t).astype(np.float64).T
    if kind == "Q8_1":
        bs = 20 if t == T.Q4_1 else 24
        m = w.reshape(w.shape[0], -1, bs)[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)
        exact = d.astype(np.float64) * qs.reshape(n, -1, 32).astype(np.float64).sum(-1)
        ref = ref + (s.astype(np.float64) - exact) @ m.T
    return ref


def n_in(t, wide=False):
    """Whole weight blocks, several micro-kernel blocks: 2 or 4 of 256, 5 or 9 of 128, 18 or 34 of 32."""
    return {256: (512, 1024), 128: (640, 1152)}.get(type_info(t).block_size, (576, 1088))[wide]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok,n_out", [(19, 37), (40, 64), (1, 16)])
def test_gemm_exact(t, n_tok, n_out, flavour):
    """Within float32 accumulation of the exact integer math: any unpacking, scale or offset slip shows."""
    k = n_in(t, wide=n_tok == 40)
    w = make_weights(t, n_out, k, seed=n_tok + n_out)
    x = (np.random.default_rng(n_tok).standard_normal((n_tok, k)) * 3).astype(np.float32)
    x[0, :40] = 0  # a zero block (zero activation scale)
    out = np.full((n_tok, n_out), np.nan, np.float32)
    G.gemm(w, t, x, out, {}, get_threads(), flavour)
    ref = exact_reference(w, t, x)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("t", [T.Q4_0, T.Q8_0, T.Q4_1, T.Q4_K, T.Q6_K, T.Q2_K, T.IQ4_XS], ids=lambda t: t.name)
def test_gemm_threads_identical(t, flavour):
    k = n_in(t)
    w = make_weights(t, 200, k, seed=4)
    x = np.random.default_rng(5).standard_normal((45, k)).astype(np.float32)
    outs = []
    for n in (1, 2):
        set_threads(n)
        out = np.empty((45, 200), np.float32)
        G.gemm(w, t, x, out, {}, n, flavour)
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_tokens_do_not_interact(flavour):
    """A token's outputs do not depend on which other tokens share its micro-kernel group."""
    t = T.Q4_K
    w = make_weights(t, 48, 512, seed=1)
    x = np.random.default_rng(6).standard_normal((21, 512)).astype(np.float32)
    full = np.empty((21, 48), np.float32)
    G.gemm(w, t, x, full, {}, get_threads(), flavour)
    part = np.empty((5, 48), np.float32)
    G.gemm(w, t, x[13:18], part, {}, get_threads(), flavour)
    assert part.tobytes() == full[13:18].tobytes()


@pytest.mark.parametrize("flavour, insn", [("neon", "sdot"), ("i8mm", "smmla")])
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_K, T.IQ4_XS], ids=lambda t: t.name)
def test_arm_gemm_instruction(t, flavour, insn):
    """The neon tiles' machine code multiplies with ``sdot``, the i8mm tiles' with ``smmla``, not LLVM's
    widening multiplies of generic IR: the type's tile (built apart from the disk cache, whose code numba
    does not list) has the instruction."""
    if flavour not in FLAVOURS:
        pytest.skip(f"not an AArch64 CPU with {flavour} (tools/arm64_tests.sh)")
    asm = G.gemm_tile_kernel(t, flavour, cache=False)._library.get_asm_str()
    assert f"{insn}\t" in asm or f"{insn} " in asm


@pytest.mark.parametrize("kind", ["Q8_0", "Q8_1", "Q8_K"])
def test_activations_are_the_gemvs(kind):
    x = np.random.default_rng(7).standard_normal((11, 512)).astype(np.float32)
    want = K.quantize_activations(x, kind)
    got = G.quantized_activations(x, kind)
    for a, b in zip(got, want):
        assert a.shape[0] % G.COLS == 0 and not a[11:].any()  # zero padding rows
        assert a[:11].tobytes() == b.tobytes()


@pytest.mark.parametrize("level", [lv for lv in isa.buildable() if gemm_flavour(isa.BY_NAME[lv].variant)])
def test_matmul_routes_batches_to_gemm(monkeypatch, level):
    """By default (QUANTKIT_GEMM unset), from GEMM_MIN_TOKENS tokens on (and only then) matmul runs the
    GEMM of the level's flavour; its result is matmul's. QUANTKIT_GEMM=0 switches back to the
    dequantize + BLAS prefill."""
    monkeypatch.delenv("QUANTKIT_GEMM", raising=False)
    monkeypatch.setenv("QUANTKIT_KERNELS", level)
    t = T.Q6_K
    w = make_weights(t, 32, 512, seed=2)
    x = np.random.default_rng(8).standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    calls = []
    real = G.gemm
    monkeypatch.setattr(G, "gemm", lambda *a: calls.append(a[1]) or real(*a))
    flavours = []
    real_kernel = G.gemm_kernel
    monkeypatch.setattr(G, "gemm_kernel", lambda t, fl, *a: flavours.append(fl) or real_kernel(t, fl, *a))
    y = K.matmul(w, t, x)
    assert calls == [t] and flavours == [gemm_flavour(isa.BY_NAME[level].variant)]
    np.testing.assert_allclose(y, exact_reference(w, t, x), rtol=2e-6, atol=2e-6 * np.abs(y).max())
    K.matmul(w, t, x[1:])
    assert calls == [t]
    monkeypatch.setenv("QUANTKIT_GEMM", "0")
    K.matmul(w, t, x)
    assert calls == [t]
