"""Row dots of TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS, IQ3_S (quantkit/kernels/lowbit.py) against a float64 dot
of the dequantized operands: weights as ggml dequantizes them (checked against ggml in
test_golden_lowbit.py), activations ``q * d`` of the type's vec_dot type."""

from __future__ import annotations

import numpy as np
import pytest

import quantkit.quants as Q
from quantkit.kernels.activations import ACT_LAYOUT, quantize_activations
from quantkit.formats.ggml_types import type_info
from quantkit.kernels.ir import RUNNABLE_VARIANTS
from quantkit.kernels.ir_rowdot import row_dots
from quantkit.kernels.lowbit import SPECS, row_q1_0
from quantkit.kernels.vecdot import build, rowdot_ir

N_IN = 1024


def _operands(t: str, kind: str, rows: np.ndarray, seed: int):
    w = Q.quantize(rows, t)
    x = np.random.default_rng(seed).standard_normal((1, N_IN)).astype(np.float32)
    qs, d, s = quantize_activations(x, kind)
    qk = ACT_LAYOUT[kind][0]
    a = qs[0].astype(np.float64) * np.repeat(d[0].astype(np.float64), qk)
    return w, (qs[0], d[0], s[0]), Q.dequantize(w, t).astype(np.float64), a


def _impls():
    return [pytest.param(t, v, id=f"{t}-{v}") for v in RUNNABLE_VARIANTS if v != "plain"
            for t in sorted([*SPECS, "Q1_0"])]


def _rowdot(t: str, impl: str):
    """The IR row dot of a variant: ir_rowdot.ROW_SPECS's entry (from lowbit.SPECS), or Q1_0's own loop."""
    row = row_q1_0(impl) if t == "Q1_0" else row_dots(impl)[t]
    return build(rowdot_ir, f"{t}_{impl}_test", False, ROW=row)


@pytest.mark.parametrize("t,impl", _impls())
@pytest.mark.parametrize("case", ["student_t", "normal", "zeros_and_outliers"])
def test_rowdot_equals_float64_dot_of_dequantized(t, impl, case):
    kind = type_info(t).vec_dot_type
    fn = _rowdot(t, impl)
    assert Q.traits(t).qtype.name == t
    g = np.random.default_rng(7)
    if case == "student_t":
        rows = g.standard_t(3, (6, N_IN)) * 0.05
    elif case == "normal":
        rows = g.standard_normal((6, N_IN))
    else:
        rows = np.zeros((6, N_IN))
        rows[:, ::97] = g.uniform(-5, 5, (6, len(range(0, N_IN, 97))))
    rows = rows.astype(np.float32)
    w, (xq, xd, xs), wd, a = _operands(t, kind, rows, 11)
    sc = np.zeros(16, np.int32)
    for r in range(rows.shape[0]):
        got = fn(w[r], xq, xd, xs, sc)
        terms = wd[r] * a
        want = terms.sum()
        # one float product per lane of 8, taken before an offset (128 * sum(q) for MXFP4) cancels, so up
        # to ~1e-5. One wrong value of 1024 would be ~1e-3 of the sum.
        tol = 2e-5 * np.abs(terms).sum() + 1e-30
        assert abs(float(got) - want) <= tol, (t, r, float(got), want, tol)
