"""quantkit.jit's decorators: what a kernel's flags are does not depend on who calls it; its atomic
chunk counter hands each chunk to exactly one thread."""

from __future__ import annotations

import numpy as np

import pytest

from quantkit.jit import fetch_add, get_threads, njit, njit_fast, njit_parallel, prange, set_threads

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


@njit_parallel
def _claim_all(n, ctr, hits, owner, nth):
    """Chunks 0..n-1 claimed from ctr[3] by nth threads, each counting its claims in hits, recording the
    worker index that took it (a prange index per thread) in owner."""
    for t in prange(nth):
        c = fetch_add(ctr, 3, 1)
        while c < n:
            hits[c] += 1
            owner[c] = t
            c = fetch_add(ctr, 3, 1)


@njit
def _serial_adds(a):
    return fetch_add(a, 1, 5), fetch_add(a, 1, -2), a[1]


def test_fetch_add_returns_the_old_value():
    a = np.array([7, 40, 9], np.int64)
    assert _serial_adds(a) == (40, 45, 43)
    assert a.tolist() == [7, 43, 9]


def test_chunk_counter_gives_each_chunk_to_one_thread():
    """Two threads claiming 200000 chunks of nothing, so their claims interleave as fast as they can: with a
    plain (non-atomic) increment some chunks are taken twice or skipped; here each is taken once and the
    counter ends at n + one failed claim per thread. A busy machine may start the second thread after
    the first took everything: up to 5 runs, until one had both threads claiming."""
    if get_threads() < 2 and set_threads(2) < 2:
        pytest.skip("one core")
    before = get_threads()
    both = False
    try:
        set_threads(2)
        n = 200_000
        for _ in range(5):
            ctr = np.zeros(8, np.int64)
            hits = np.zeros(n, np.int64)
            owner = np.full(n, -1, np.int64)
            _claim_all(n, ctr, hits, owner, 2)
            assert hits.min() == 1 and hits.max() == 1
            assert ctr[3] == n + 2 and ctr[[0, 1, 2, 4]].tolist() == [0, 0, 0, 0]
            both = set(np.unique(owner).tolist()) == {0, 1}
            if both:
                break
    finally:
        set_threads(before)
    if not both:
        pytest.skip("the second thread never claimed alongside the first")
