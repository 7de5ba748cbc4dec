"""Error compensation around a type's own codec (``quantize --optimize``): GPTQ's column sweep, after
Frantar, Ashkboos, Hoefler and Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers" (ICLR 2023, arXiv:2210.17323), with llama.cpp's codec in place of GPTQ's
round-to-nearest, so the output is the same type, the same bytes per block, and any llama.cpp loads it.

A matrix ``W`` (rows x n) multiplies inputs ``x`` whose Gram matrix ``H = E[x x^T]`` (n x n) was measured
on calibration text. Quantizing ``W`` to ``W^`` adds the output error ``sum_rows e H e^T`` (``e`` a row of
``W^ - W``), which this minimizes. The columns are swept left to right one codec block (``QK`` values:
32 for the legacy types and IQ4_NL, 256 for the K-quants and IQ4_XS) at a time.

**The factor.** GPTQ pushes each block's error into the columns right of it through ``U``, the upper
Cholesky factor of ``H^-1`` (``H^-1 = U^T U``): ``W_r -= (W0_b - Q_b) U_bb^-1 U_br``. ``U`` is the
inverse of ``R``, the upper triangular factor with ``H = R R^T`` (a Cholesky factorization of ``H`` with
its columns in reverse order), and the pushes add up to a closed form that needs ``R`` alone: with
``E = W - Q`` the error of the columns already quantized, block ``b`` is quantized from

    ``X_b = W_b + (E_<b R_<b,b) R_bb^-1``

(GPTQ's sweep written left-looking: a matrix product over the columns done, instead of an update of all
those to come). ``factor`` makes ``R`` by one blocked Cholesky (``cholesky``: O(n^3 / 3), its products on
all threads in a split that does not depend on their count) -- no inverse of the n x n matrix -- and
the small per-block ``R_bb^-1``.

**Inside a block** its columns are quantized by the type's own ``quantize_row_X_impl`` search (scales
and levels as llama.cpp chooses them, with the imatrix weights as llama-quantize passes them) on the
compensated values, ``SUB`` columns fixed per step: after each step the fixed columns' error is pushed
into the block's later columns (``U_ss^-1 U_s,rest`` inside ``U_bb = R_bb^-1``) and the block is searched
again; the last search gives the bytes.

**The error.** ``eps = E R`` has ``|eps|^2 = e H e^T``: the sweep gets it per block almost for free
(``E_b R_bb + E_<b R_<b,b``, the second term being the product it needed anyway), and llama.cpp's plain
rounding costs one triangular product. The caller keeps, row by row, whichever is lower (``compensate``),
so the result is never worse than llama-quantize's on the quantity optimized.

Every row chunk (``CHUNK`` rows, a split that does not depend on the thread count) is swept on its own
with one-thread BLAS, so the bytes are the same for any thread count.

Types: every codec whose row kernel has the base's ``(x, y, qw, r0, r1)`` form (``SUPPORTED``); the
lattice types (IQ1/IQ2/IQ3) have their own row drivers and are not swept yet.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import blas_one_thread, frozen, over_chunks, run_tasks, specialize

F32 = np.float32
#: the dampening, a share of the mean diagonal added to H's diagonal (GPTQ's ``percdamp``, 0.01 there):
#: with 10 x 512 calibration tokens, SmolLM2's sweeps at 0.01 lowered e H e^T on the calibration text 2.5x
#: but on the evaluation text less (0.53x for attn_q, 0.86x for a 1536-wide ffn_down); 0.1 gave 0.51x
#: and 0.76x there (docs/optimize.md)
DAMP = 0.1
#: rows swept per task (each task's products one BLAS call per block, whatever the thread count)
CHUNK = 256
#: the Cholesky's block (its panel and the tiles of its trailing update)
CHOL_BLOCK = 256
#: a row takes the sweep's bytes only when its float32-estimated ``e H e^T`` is below llama.cpp's by more
#: than this share (the estimates were within 2e-7 of float64 ones on the tests' problems)
MARGIN = 1e-4

#: the types swept, each with its columns fixed per step (``SUB``): a K-quant's or IQ4_XS's 256-value
#: block in steps of 64, a 32-value block in steps of 16. Each step is one more search of the block by
#: the type's codec, the sweep's main cost: steps of 32 lowered ``e H e^T`` by 2 % more on SmolLM2's
#: matrices (Q3_K 0.396 against 0.405 of llama.cpp's) at 1.3-1.5x the time (docs/optimize.md)
SUB_STEP = {
    T.Q4_0: 16, T.Q4_1: 16, T.Q5_0: 16, T.Q5_1: 16, T.Q8_0: 16, T.IQ4_NL: 16,
    T.Q2_K: 64, T.Q3_K: 64, T.Q4_K: 64, T.Q5_K: 64, T.Q6_K: 64, T.IQ4_XS: 64,
}
SUPPORTED = frozenset(SUB_STEP)


class Factor(NamedTuple):
    """What the sweep needs of a Gram matrix for one (block, step): ``R`` (float32 n x n, upper,
    ``H' = R R^T`` for the dampened ``H'``), ``Ub`` (float32 (n / qk, qk, qk), each block's ``R_bb^-1``),
    ``Pin`` (float32 (n / qk, qk, qk): a block's step pushes ``U_ss^-1 U_s,rest``), ``lam`` (the dampening
    added to the diagonal) and ``dead`` (the input columns never active, whose diagonal is 1 + lam)."""

    R: np.ndarray
    Ub: np.ndarray
    Pin: np.ndarray
    lam: float
    dead: np.ndarray


def cholesky(a: np.ndarray, nb: int = CHOL_BLOCK) -> np.ndarray:
    """Lower ``L`` with ``a = L L^T`` (``a`` float64 symmetric positive definite, overwritten by ``L``), blocked
    right-looking: a ``nb``-wide diagonal block by LAPACK, the panel below it through that block's
    inverse, the trailing matrix's lower tiles each one product. The tiles are fixed by ``nb``, not by
    the thread count, so ``L`` is the same for any."""
    n = a.shape[0]
    with blas_one_thread():
        for k0 in range(0, n, nb):
            k1 = min(n, k0 + nb)
            lkk = np.linalg.cholesky(a[k0:k1, k0:k1])
            a[k0:k1, k0:k1] = lkk
            if k1 == n:
                break
            inv_t = np.ascontiguousarray(np.linalg.inv(lkk).T)
            tiles = [(t0, min(n, t0 + nb)) for t0 in range(k1, n, nb)]

            def panel(t0, t1):
                a[t0:t1, k0:k1] = a[t0:t1, k0:k1] @ inv_t

            run_tasks([lambda t=t: panel(*t) for t in tiles])
            p = np.ascontiguousarray(a[k1:, k0:k1])

            def trail(t0, t1):
                a[t0:t1, k1:t1] -= p[t0 - k1:t1 - k1] @ p[:t1 - k1].T

            run_tasks([lambda t=t: trail(*t) for t in tiles])
        for k0 in range(0, n, nb):   # the upper triangle to zeros, in place
            a[k0:k0 + nb, k0:] = np.tril(a[k0:k0 + nb, k0:])
    return a


def reversed_gram(h: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """``scale * h`` (n x n) with rows and columns reversed (``J H J``), a float64 copy for ``reverse_cholesky``."""
    a = np.array(h[::-1, ::-1], dtype=np.float64, copy=True)
    if scale != 1.0:
        a *= scale
    return a


def reverse_cholesky(a: np.ndarray, damp: float = DAMP) -> tuple[np.ndarray, float, np.ndarray]:
    """``(R, lam, dead)`` of the Gram matrix ``H`` whose ``reversed_gram`` is ``a`` (overwritten): ``R``
    (float32, upper) with ``H' = R R^T`` for ``H' = H + lam I``, ``lam = damp * mean(diag H)`` (an input
    column never active, ``dead``, gets ``H_ii = 1``, as GPTQ's dead columns), from a float64 Cholesky
    factorization of ``H'`` with rows and columns reversed (``J H' J = L L^T``, ``R = J L J``)."""
    n = a.shape[0]
    d = np.diag(a)[::-1].copy()
    dead = d <= 0
    rd = dead[::-1]
    a[rd, :] = 0.0
    a[:, rd] = 0.0
    d[dead] = 1.0
    lam = damp * float(np.mean(d))
    a[np.diag_indices(n)] = d[::-1] + lam
    cholesky(a)
    return np.ascontiguousarray(a[::-1, ::-1], dtype=F32), lam, dead


def factor(h: np.ndarray, qk: int, sub: int, damp: float = DAMP, rc=None) -> Factor:
    """The ``Factor`` of Gram matrix ``h`` (n x n) for blocks of ``qk`` columns fixed ``sub`` at a time;
    ``rc``: its ``reverse_cholesky`` when made already (it does not depend on ``qk`` / ``sub``)."""
    R, lam, dead = reverse_cholesky(reversed_gram(h), damp) if rc is None else rc
    nb = R.shape[0] // qk
    Ub = np.empty((nb, qk, qk), np.float64)
    Pin = np.zeros((nb, qk, qk), np.float64)
    with blas_one_thread():
        for b in range(nb):
            c0 = b * qk
            U = np.triu(np.linalg.inv(R[c0:c0 + qk, c0:c0 + qk].astype(np.float64)))
            Ub[b] = U
            for s0 in range(0, qk - sub, sub):
                s1 = s0 + sub
                Pin[b, s0:s1, s1:] = np.linalg.solve(U[s0:s1, s0:s1], U[s0:s1, s1:])
    return Factor(R, Ub.astype(F32), Pin.astype(F32), lam, dead)


def _block_body(X, Yb, Q, qw, Pin):
    """One block of ``X`` (float32 rows x QK, compensated in place) into ``Yb``'s bytes and their decoded
    values ``Q``, ``SUB`` columns fixed per step (module docstring). ``QROWS`` / ``DROWS``: the type's
    serial row-range quantizer and decoder -- bound per type (``jit.specialize``)."""
    qk = QK  # noqa: F821
    sub = SUB  # noqa: F821
    nr = X.shape[0]
    for s0 in range(0, qk, sub):
        QROWS(X, Yb, qw, 0, nr)  # noqa: F821
        s1 = s0 + sub
        if s1 < qk:  # fix columns s0..s1-1, push their error into the block's later columns
            DROWS(Yb, Q, 0, nr)  # noqa: F821
            for r in range(nr):
                xr = X[r]
                for i in range(s0, s1):
                    e = xr[i] - Q[r, i]
                    pr = Pin[i]
                    for j in range(s1, qk):
                        xr[j] -= e * pr[j]
    DROWS(Yb, Q, 0, nr)  # noqa: F821


def _block_kernel(cls, sub: int):
    return specialize(_block_body, f"{cls.qtype.name}_{sub}", QROWS=cls.quantize_rows.kernel,
                      DROWS=cls.dequantize_rows.kernel, QK=cls.block_size, SUB=sub)


def _sweep_chunk(W, Y, qw, F, kern, qk, ts, err, r0, r1):
    """Rows r0..r1-1 of ``W`` swept into ``Y``; ``err[r]`` their ``|E R|^2`` (float64)."""
    n = W.shape[1]
    nr = r1 - r0
    Wc = W[r0:r1]
    E = np.empty((nr, n), F32)               # W - Q of the columns done
    eps2 = np.zeros(nr, np.float64)
    Q = np.empty((nr, qk), F32)
    Yb = np.empty((nr, ts), np.uint8)
    for b, c0 in enumerate(range(0, n, qk)):
        c1 = c0 + qk
        X = np.array(Wc[:, c0:c1], dtype=F32, order="C")
        G = None
        if c0:
            G = E[:, :c0] @ F.R[:c0, c0:c1]  # (nr, qk): the errors so far seen through R
            X += G @ F.Ub[b]
        kern(X, Yb, Q, qw[c0:c1] if qw.shape[0] else qw, F.Pin[b])
        Y[r0:r1, b * ts:(b + 1) * ts] = Yb
        Eb = E[:, c0:c1]
        np.subtract(Wc[:, c0:c1], Q, out=Eb)
        eps = Eb @ F.R[c0:c1, c0:c1]
        if G is not None:
            eps += G
        eps2 += np.einsum("ij,ij->i", eps, eps, dtype=np.float64)
    err[r0:r1] = eps2


def _error_chunk(W, Qd, F, qk, err, r0, r1):
    """``err[r] = |(W - Qd) R|^2`` (float64) of rows r0..r1-1: the plain rounding's, by column blocks."""
    n = W.shape[1]
    E = np.subtract(W[r0:r1], Qd[r0:r1], dtype=F32)
    s = np.zeros(r1 - r0, np.float64)
    for c0 in range(0, n, qk):
        c1 = c0 + qk
        eps = E[:, :c1] @ F.R[:c1, c0:c1]
        s += np.einsum("ij,ij->i", eps, eps, dtype=np.float64)
    err[r0:r1] = s


def _true_error(err, W, Qd, F):
    """``e H e^T`` from ``|E R|^2 = e H' e^T``: less the dampening and the dead columns' unit diagonal
    (by row chunks: no float64 copy of the matrix)."""
    out = np.array(err, dtype=np.float64)
    for r0 in range(0, W.shape[0], CHUNK):
        e = np.subtract(Qd[r0:r0 + CHUNK], W[r0:r0 + CHUNK], dtype=np.float64)
        out[r0:r0 + CHUNK] -= F.lam * np.einsum("ij,ij->i", e, e)
        if F.dead.any():
            out[r0:r0 + CHUNK] -= np.einsum("ij,ij->i", e[:, F.dead], e[:, F.dead])
    return out


def sweep(w: np.ndarray, qtype: T, F: Factor, weights: np.ndarray | None,
          sub: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The compensated quantization of ``w`` (float32 rows x n, not modified) to ``qtype``: its bytes
    (uint8 rows x row_bytes) and each row's ``e H e^T`` (float64, from float32 products). ``F`` from
    ``factor`` with the type's block and step ``sub`` (default ``SUB_STEP``); ``weights`` the imatrix row
    llama-quantize would pass (or None)."""
    from quantkit.quants import dequantize, traits

    cls = traits(qtype)
    if qtype not in SUPPORTED:
        raise ValueError(f"{qtype.name}: no compensated sweep for this type")
    sub = SUB_STEP[qtype] if sub is None else sub
    W = np.ascontiguousarray(w, dtype=F32)
    Y = np.empty((W.shape[0], cls.row_bytes(W.shape[1])), dtype=np.uint8)
    # read-only, as ``quantize`` passes them: the row quantizers' builds for it serve here too
    qw = frozen(np.zeros(0, F32) if weights is None or not cls.uses_imatrix else np.ascontiguousarray(weights, dtype=F32))
    err = np.empty(W.shape[0], np.float64)
    over_chunks(_sweep_chunk, W.shape[0], CHUNK, W, Y, qw, F, _block_kernel(cls, sub), cls.block_size,
                cls.type_size, err)
    return Y, _true_error(err, W, dequantize(Y, qtype).reshape(W.shape), F)


def plain_errors(w: np.ndarray, qd: np.ndarray, qk: int, F: Factor) -> np.ndarray:
    """Each row's ``e H e^T`` (float64, from float32 products) for decoded values ``qd`` of ``w``."""
    W = np.ascontiguousarray(w, dtype=F32)
    err = np.empty(W.shape[0], np.float64)
    over_chunks(_error_chunk, W.shape[0], CHUNK, W, np.ascontiguousarray(qd, dtype=F32), F, qk, err)
    return _true_error(err, W, qd, F)


def compensate(w: np.ndarray, qtype: T, F: Factor, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, taken)``: ``w`` (float32 rows x n) quantized to ``qtype`` row by row as whichever of
    ``sweep`` and llama.cpp's plain rounding (``quantize`` with the same weights) has the lower
    ``e H e^T`` -- the sweep's only when lower by more than ``MARGIN`` (the estimates are float32
    products) -- and which rows took the sweep's."""
    from quantkit.quants import dequantize, quantize, traits

    base = quantize(w, qtype, weights)
    opt, e_opt = sweep(w, qtype, F, weights)
    e_base = plain_errors(w, dequantize(base, qtype).reshape(w.shape), traits(qtype).block_size, F)
    taken = e_opt < e_base * (1.0 - MARGIN)
    base[taken] = opt[taken]
    return base, taken
