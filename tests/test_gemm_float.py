"""The float weights' prefill GEMM (kernels/gemm_float.py: float32 FMAs on AVX-512, BF16 on AVX512-BF16's
vdpbf16ps) against a float64 product of the same values -- the weights as stored, the activations
rounded as ggml's from_float rounds them, both read back by numpy, not by quantkit; partial row tiles
and token groups; 1 thread == 2 threads byte for byte; a token's outputs do not depend on the tokens
beside it; matmul routes float batches to it (and `quantkit bench`'s kernel line says so) and
QUANTKIT_GEMM=0 back to the dequantize + BLAS prefill."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from quantkit import isa
from quantkit import kernels as K
from quantkit.jit import get_threads, set_threads
from quantkit.kernels import gemm_float as G
from quantkit.kernels.cpu_traits import describe, float_gemm
from quantkit.kernels.ir import HAS_AVX2, HAS_BF16_DOT

from test_kernels import _restore_threads  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.skipif(not HAS_AVX2, reason="the float GEMM needs AVX2 (x86)")
#: (weight type, product) this host runs
CASES = [(T.F32, "fma"), (T.F16, "fma"), (T.BF16, "fma")] + ([(T.BF16, "bf16")] if HAS_BF16_DOT else [])
IDS = [f"{t.name}-{op}" for t, op in CASES]


def bf16_round(x):
    """x rounded to bf16 (nearest, ties to even: ggml's GGML_FP32_TO_BF16), as float32."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (r.astype(np.uint32) << 16).view(np.float32)


def rounded(x, t):
    """x as ggml's from_float for weight type t leaves it (F16: fp16, nearest even; BF16: bf16)."""
    return {T.F32: lambda v: v, T.F16: lambda v: v.astype(np.float16).astype(np.float32), T.BF16: bf16_round}[t](x)


def float_weights(t, n_out, k, seed):
    """(uint8 (n_out, row bytes) as a GGUF tensor of type t holds them, their float64 values)."""
    f = rounded((np.random.default_rng(seed).standard_normal((n_out, k)) * 0.05).astype(np.float32), t)
    raw = {T.F32: f, T.F16: f.astype(np.float16),
           T.BF16: (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)}[t]
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n_out, -1), f.astype(np.float64)


@pytest.mark.parametrize("t, op", CASES, ids=IDS)
@pytest.mark.parametrize("n_tok, n_out, k", [(37, 100, 576), (8, 32, 64), (64, 48, 2048)])
def test_gemm_float_exact(t, op, n_tok, n_out, k):
    w, wd = float_weights(t, n_out, k, seed=n_out)
    x = np.random.default_rng(k).standard_normal((n_tok, k)).astype(np.float32)
    x[:, ::97] *= 30  # outliers, as real activations have
    ref = rounded(x, t).astype(np.float64) @ wd.T
    out = np.empty((n_tok, n_out), np.float32)
    G.gemm_float(w, t, x, out, get_threads(), {}, op)
    # one float32 accumulator per output over K: up to ~2e-6 of the largest output measured at K = 2048;
    # a lost or doubled product would be ~1e-3
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("t, op", CASES, ids=IDS)
def test_gemm_float_threads_and_neighbours(t, op):
    w, _ = float_weights(t, 200, 1024, seed=4)
    x = np.random.default_rng(2).standard_normal((29, 1024)).astype(np.float32)
    outs = []
    for n in (1, 2):
        set_threads(n)
        o = np.empty((29, 200), np.float32)
        G.gemm_float(w, t, x, o, n, {}, op)
        outs.append(o)
    assert outs[0].tobytes() == outs[1].tobytes()
    part = np.empty((5, 200), np.float32)
    G.gemm_float(w, t, x[13:18], part, 2, {}, op)
    assert part.tobytes() == outs[0][13:18].tobytes()


@pytest.mark.skipif(isa.forced() == isa.PLAIN, reason="QUANTKIT_KERNELS=plain: batches on BLAS")
@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
@pytest.mark.parametrize("t", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_matmul_routes_float_batches(monkeypatch, t, vendor):
    """Batches of float weights go to the float GEMM: BF16 on vdpbf16ps where AVX512-BF16 is allowed,
    except on Intel CPUs (their FMAs measured faster), every other case on FMAs."""
    monkeypatch.delenv("QUANTKIT_GEMM", raising=False)
    monkeypatch.setattr(isa, "cpu_vendor", lambda: vendor)
    op = "bf16" if t == T.BF16 and HAS_BF16_DOT and vendor == "AuthenticAMD" else "fma"
    assert float_gemm(t) == op
    w, wd = float_weights(t, 64, 512, seed=9)
    x = np.random.default_rng(8).standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    calls = []
    real = G.gemm_float
    monkeypatch.setattr(G, "gemm_float", lambda *a: calls.append(a[-1]) or real(*a))
    y = K.matmul(w, t, x)
    assert calls == [op]
    ref = rounded(x, t).astype(np.float64) @ wd.T
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    K.matmul(w, t, x[1:])  # below the batch threshold: the row dots
    level = "avx512bf16" if op == "bf16" else isa.selected()
    assert describe([t]).endswith(f" gemm {level}")  # what `quantkit bench` says ran
    monkeypatch.setenv("QUANTKIT_GEMM", "0")
    z = K.matmul(w, t, x)
    assert calls == [op] and describe([t]).endswith(" gemm off")
    np.testing.assert_allclose(z, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
