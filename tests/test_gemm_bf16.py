"""The BF16 prefill on AVX512-BF16's vdpbf16ps (kernels/gemm_bf16.py) against a float64 product of the
same bf16 values (the weights as stored, the activations as ggml's from_float rounds them, read back by
numpy, not by quantkit); partial row tiles and token groups; 1 thread == 2 threads byte for byte; a
token's outputs do not depend on the tokens beside it; matmul routes BF16 batches to it (and `quantkit
bench`'s kernel line says so) and QUANTKIT_GEMM=0 back to the dequantize + BLAS prefill."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from quantkit import kernels as K
from quantkit.jit import get_threads, set_threads
from quantkit.kernels import gemm_bf16 as G
from quantkit.kernels.cpu_traits import describe
from quantkit.kernels.ir import HAS_BF16_DOT

from test_kernels import _restore_threads  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.skipif(not HAS_BF16_DOT, reason="needs AVX512-BF16 (vdpbf16ps) at the level in force")


def bf16_weights(n_out, k, seed):
    """(uint8 (n_out, 2k) as a GGUF BF16 tensor holds them, their float64 values), from numpy alone."""
    f = (np.random.default_rng(seed).standard_normal((n_out, k)) * 0.05).astype(np.float32)
    hi = ((f.view(np.uint32) + np.uint32(0x8000)) >> np.uint32(16)).astype(np.uint16)
    return hi.view(np.uint8).reshape(n_out, 2 * k), (hi.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bf16_round(x):
    """x rounded to bf16 (nearest, ties to even: ggml's GGML_FP32_TO_BF16), as float64."""
    u = x.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (r.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("n_tok, n_out, k", [(37, 100, 576), (8, 32, 64), (64, 48, 2048)])
def test_gemm_bf16_exact(n_tok, n_out, k):
    w, wd = bf16_weights(n_out, k, seed=n_out)
    x = np.random.default_rng(k).standard_normal((n_tok, k)).astype(np.float32)
    x[:, ::97] *= 30  # outliers, as real activations have
    ref = bf16_round(x) @ wd.T
    out = np.empty((n_tok, n_out), np.float32)
    G.gemm_bf16(w, x, out, get_threads(), {})
    # one float32 accumulator per output over K (2 products rounded in per step): up to ~2e-6 of the
    # largest output measured at K = 2048; a lost or doubled pair would be ~1e-3
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_gemm_bf16_threads_and_neighbours():
    w, _ = bf16_weights(200, 1024, seed=4)
    x = np.random.default_rng(2).standard_normal((29, 1024)).astype(np.float32)
    outs = []
    for n in (1, 2):
        set_threads(n)
        o = np.empty((29, 200), np.float32)
        G.gemm_bf16(w, x, o, n, {})
        outs.append(o)
    assert outs[0].tobytes() == outs[1].tobytes()
    part = np.empty((5, 200), np.float32)
    G.gemm_bf16(w, x[13:18], part, 2, {})
    assert part.tobytes() == outs[0][13:18].tobytes()


def test_matmul_routes_bf16_batches(monkeypatch):
    monkeypatch.delenv("QUANTKIT_GEMM", raising=False)
    w, wd = bf16_weights(64, 512, seed=9)
    x = np.random.default_rng(8).standard_normal((K.GEMM_MIN_TOKENS, 512)).astype(np.float32)
    calls = []
    real = G.gemm_bf16
    monkeypatch.setattr(G, "gemm_bf16", lambda *a: calls.append(a[0].shape) or real(*a))
    y = K.matmul(w, T.BF16, x)
    assert calls == [(64, 1024)]
    ref = bf16_round(x) @ wd.T
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    K.matmul(w, T.BF16, x[1:])  # below the batch threshold: the row dots
    assert describe([T.BF16]).endswith(" gemm avx512bf16")  # what `quantkit bench` says ran
    monkeypatch.setenv("QUANTKIT_GEMM", "0")
    z = K.matmul(w, T.BF16, x)
    assert calls == [(64, 1024)] and describe([T.BF16]).endswith(" gemm off")
    np.testing.assert_allclose(z, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
