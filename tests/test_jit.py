"""quantkit.jit's decorators: what a kernel's flags are does not depend on who calls it."""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit, njit_fast

# a*b rounds to 1 + 2**-11 (the 2**-24 is a tie, to even); fused, a*b - 1 keeps it: 2**-11 + 2**-24
A = np.float32(1 + 2.0 ** -12)


@njit
def _mul_add_exact(a, b, c):
    return a * b + c


@njit_fast
def _fast_caller(a, b, c):
    return _mul_add_exact(a, b, c)


def test_exact_kernel_called_from_a_fastmath_kernel_stays_exact():
    """numba inherits an unset fastmath from the caller; njit sets it, so a codec called from a fastmath
    kernel (Q8_K activations in the decode step) rounds as ggml does, not fused into an FMA."""
    want = np.float32(np.float32(A * A) - np.float32(1.0))
    assert want == np.float32(2.0 ** -11)
    assert _fast_caller(A, A, np.float32(-1.0)) == want
    assert _mul_add_exact(A, A, np.float32(-1.0)) == want
