"""Every integer row dot of the registry (a type whose record has an ``ir`` or ``loop`` row entry,
kernels/cpu_traits.py) in every IR variant this host runs, against a float64 dot of what the bytes mean:
the codec's dequantized weights (checked against ggml in test_golden*.py) times the dequantized
activations of the type's vec_dot type (``q * d``); on quantized rows (several distributions, an all-zero
row, sparse outliers) and on random bytes (every grid index, sign, scale and bit in play, so a wrong lane,
group or bit shows). Then the 2-row form and the GEMV built on them against the 1-row dot.

Q4_1 and Q5_1 are left to test_kernels.py's exact-dot test: their Q8_1 activations carry an fp16 sum that
ggml's dot uses in place of the exact one, which that test accounts for."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import quantkit.kernels as K
import quantkit.quants as Q
from quantkit.formats.ggml_types import type_info
from quantkit.jit import frozen
from quantkit.kernels.activations import ACT_LAYOUT, quantize_activations
from quantkit.kernels.cpu_traits import CPU_TRAITS, kind_of
from quantkit.kernels.ir import RUNNABLE_VARIANTS
from quantkit.kernels.vecdot import build, rowdot2_ir, row_intrinsic

from test_kernels import make_weights

#: the types with an integer row dot of their own, not on Q8_1 activations
TYPES = [n for n in CPU_TRAITS if kind_of(n, "row") in ("ir", "loop") and type_info(n).vec_dot_type != "Q8_1"]
VARIANTS = [v for v in RUNNABLE_VARIANTS if v != "plain"]


def _n_in(t, wide):
    return 1280 if type_info(t).block_size == 256 and wide else (1024 if wide else 512)


def _rows(t, source, n_in, seed):
    g = np.random.default_rng(seed)
    if source == "random":
        return make_weights(T[t], 6, n_in, seed=seed)
    if source == "student_t":
        x = g.standard_t(3, (6, n_in)) * 0.05
    elif source == "normal":
        x = g.standard_normal((6, n_in))
    else:  # sparse outliers
        x = np.zeros((6, n_in))
        x[:, ::97] = g.uniform(-5, 5, (6, len(range(0, n_in, 97))))
    x[1] = 0.0  # an all-zero row
    return frozen(Q.quantize(x.astype(np.float32), t, imatrix=g.uniform(0.1, 2.0, n_in).astype(np.float32)))


def _activations(t, n_in, seed):
    kind = type_info(t).vec_dot_type
    x = np.random.default_rng(seed).standard_normal((3, n_in)).astype(np.float32)
    x[0, :256] = 0.0  # a zero block of activations
    qs, d, s = quantize_activations(x, kind)
    a = qs.astype(np.float64) * np.repeat(d.astype(np.float64), ACT_LAYOUT[kind][0], axis=1)
    return (qs, d, s), a


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("source,wide", [("student_t", False), ("normal", True), ("outliers", False),
                                         ("random", True)])
def test_rowdot_equals_float64_dot_of_dequantized(t, variant, source, wide):
    n_in = _n_in(t, wide)
    w = _rows(t, source, n_in, 11)
    wd = Q.dequantize(w, t).astype(np.float64)
    (xq, xd, xs), a = _activations(t, n_in, 2)
    fn = K.rowdot_kernel(T[t], variant)
    sc = np.zeros(16, np.int32)
    for r in range(w.shape[0]):
        for k in range(xq.shape[0]):
            got = float(fn(w[r], xq[k], xd[k], xs[k], sc))
            terms = wd[r] * a[k]
            # one float product per lane of 8 and block, taken before an offset (128 * sum(q), the mins)
            # cancels, so up to ~1e-5 of the absolute terms; one wrong value of 256 would be ~4e-3
            tol = 2e-5 * np.abs(terms).sum() + 1e-30
            assert abs(got - terms.sum()) <= tol, (t, variant, r, k, got, terms.sum(), tol)


@pytest.mark.parametrize("t", [n for n in TYPES if kind_of(n, "row") == "ir"])
def test_two_rows_and_matvec_equal_the_row_dot(t):
    n_in = _n_in(t, False)
    tt = T[t]
    y = make_weights(tt, 9, n_in, seed=3)
    (xq, xd, xs), _ = _activations(t, n_in, 4)
    assert tt in K.WEIGHT_TYPES and K.activation_kind(tt) == type_info(t).vec_dot_type
    sc = np.zeros(16, np.int32)
    one = K.rowdot_kernel(tt)
    want = np.array([[one(y[r], xq[k], xd[k], xs[k], sc) for r in range(y.shape[0])] for k in range(3)],
                    dtype=np.float32)
    two = build(rowdot2_ir, f"{t}_test2", False, ROW2=row_intrinsic(tt, K.default_variant(), 2))
    for r in range(0, 8, 2):
        assert two(y[r:r + 2].reshape(-1), xq[1], xd[1], xs[1], sc) == (want[1, r], want[1, r + 1])
    for parallel in (False, True):
        out = np.empty((3, y.shape[0]), np.float32)
        K.matvec_kernel(tt, parallel=parallel)(frozen(y), xq, xd, xs, out, 4)
        assert np.array_equal(out, want)


#: the types whose NEON row dots the issue names (#28); every ``ir`` / ``loop`` type has one
NEON_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS"]


@pytest.mark.skipif("neon" not in VARIANTS, reason="not an AArch64 CPU with the dot product (tools/arm64_tests.sh)")
@pytest.mark.parametrize("t", NEON_TYPES)
def test_neon_row_dots_are_sdot(t):
    """The neon variant's machine code multiplies with ``sdot`` (and looks IQ4_XS's table up with
    ``tbl``), rather than LLVM's widening multiplies of the generic IR."""
    row = row_intrinsic(T[t], "neon")

    @numba.njit(cache=False)
    def one(wr, xq, xd, xs):
        return row(wr, xq, xd, xs)

    n_in = _n_in(t, False)
    w = make_weights(T[t], 1, n_in, seed=5)
    (xq, xd, xs), _ = _activations(t, n_in, 6)
    one(w[0], xq[0], xd[0], xs[0])
    asm = one.inspect_asm(one.signatures[0])
    assert "sdot\t" in asm or "sdot " in asm, t
    if t == "IQ4_XS":
        assert "tbl\t" in asm or "tbl " in asm
