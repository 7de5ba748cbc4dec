"""Error compensation around a type's own codec (``quantize --optimize``): GPTQ's column sweep, after
Frantar, Ashkboos, Hoefler and Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers" (ICLR 2023, arXiv:2210.17323), with llama.cpp's codec in place of GPTQ's
round-to-nearest, so the output is the same type, the same bytes per block, and any llama.cpp loads it.

A matrix ``W`` (rows x n) multiplies inputs ``x`` whose Gram matrix ``H = E[x x^T]`` (n x n) was measured
on calibration text. Quantizing ``W`` to ``W^`` adds the output error ``sum_rows e H e^T`` (``e`` a row of
``W^ - W``), which this minimizes. The columns are swept left to right one codec block (``QK`` values:
32 for the legacy types and IQ4_NL, 256 for the K-quants and IQ4_XS) at a time:

1. the block's columns are quantized by the type's own ``quantize_row_X_impl`` search (scales and
   levels as llama.cpp chooses them, with the imatrix weights as llama-quantize passes them) on the
   *compensated* values, ``SUB`` columns fixed per step: after each step the fixed columns' error is
   pushed into the block's later columns and the block is searched again (the last search gives the
   bytes); ``SUB = QK`` pushes nothing within a block;
2. the block's final error ``W0_b - Q_b`` (``W0_b`` the block's values when its sweep started) is pushed
   into every column right of the block: ``W_r -= (W0_b - Q_b) U_bb^-1 U_br``, with ``U`` the upper
   Cholesky factor of ``H^-1`` (GPTQ's "lazy batch" update, for a block rounded jointly rather than
   column by column: the same optimum of ``e H e^T`` over the not-yet-quantized columns).

``factor`` precomputes both kinds of ``U_bb^-1 U_br`` into one n x n matrix ``P`` (the block-level ones
right of each block's diagonal block, the step-level ones inside it; they never overlap), once per
distinct input (q/k/v share theirs). Every row is swept on its own (``over_rows``; each row's sums in a
fixed order), so the bytes do not depend on the thread count. ``row_errors`` gives each row's
``e H e^T`` in float64: the caller keeps, row by row, whichever of this and llama.cpp's plain rounding
is lower, so the result is never worse than llama-quantize's on the quantity optimized.

Types: every codec whose row kernel has the base's ``(x, y, qw, r0, r1)`` form (``SUPPORTED``); the
lattice types (IQ1/IQ2/IQ3) have their own row drivers and are not swept yet.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.jit import njit, over_rows, specialize

F32 = np.float32
#: columns of W updated per tile of the block-level push (a tile of W's rows and of P stays in cache)
_TILE = 256
#: the dampening, a share of the mean diagonal added to H's diagonal (GPTQ's ``percdamp``, 0.01 there):
#: with 10 x 512 calibration tokens, SmolLM2's sweeps at 0.01 lowered e H e^T on the calibration text 2.5x
#: but on the evaluation text less (0.53x for attn_q, 0.86x for a 1536-wide ffn_down); 0.1 gave 0.51x
#: and 0.76x there (docs/optimize.md)
DAMP = 0.1

#: the types swept, each with its columns fixed per step (``SUB``): a K-quant's or IQ4_XS's 256-value
#: block in steps of 32, a 32-value block in steps of 16. Finer steps lowered ``e H e^T`` by at most 2 %
#: more on SmolLM2's matrices at twice the time (docs/optimize.md)
SUB_STEP = {
    T.Q4_0: 16, T.Q4_1: 16, T.Q5_0: 16, T.Q5_1: 16, T.Q8_0: 16, T.IQ4_NL: 16,
    T.Q2_K: 32, T.Q3_K: 32, T.Q4_K: 32, T.Q5_K: 32, T.Q6_K: 32, T.IQ4_XS: 32,
}
SUPPORTED = frozenset(SUB_STEP)


def factor(h: np.ndarray, qk: int, sub: int, damp: float = DAMP) -> np.ndarray:
    """``P`` (float32 n x n) for Gram matrix ``h`` (float64 n x n, symmetric): for a block b of ``qk``
    columns, ``P[b, right of b] = U_bb^-1 U_{b,right}``; inside it, for each step s of ``sub`` columns,
    ``P[s, rest of b] = U_ss^-1 U_{s,rest}``. ``U`` is the upper Cholesky factor of ``(H + damp)^-1`` (an
    input column never active gets H_ii = 1, as GPTQ's dead columns). Call under one BLAS thread for
    results independent of the thread count."""
    n = h.shape[0]
    H = np.array(h, dtype=np.float64, copy=True)
    d = np.diag(H).copy()
    dead = d <= 0
    H[dead, :] = 0.0
    H[:, dead] = 0.0
    d[dead] = 1.0
    H[np.diag_indices(n)] = d + damp * float(np.mean(d))
    Hinv = np.linalg.inv(H)
    U = np.linalg.cholesky((Hinv + Hinv.T) * 0.5).T     # H^-1 = U^T U, U upper
    P = np.zeros((n, n), dtype=np.float64)
    for c0 in range(0, n, qk):
        c1 = c0 + qk
        if c1 < n:
            P[c0:c1, c1:] = np.linalg.solve(U[c0:c1, c0:c1], U[c0:c1, c1:])
        for s0 in range(c0, c1 - sub, sub):
            s1 = s0 + sub
            P[s0:s1, s1:c1] = np.linalg.solve(U[s0:s1, s0:s1], U[s0:s1, s1:c1])
    return P.astype(np.float32)


def _sweep_body(W, Y, qw, P, r0, r1):
    """Rows r0..r1-1 of ``W`` (float32, compensated in place) swept into ``Y``'s bytes (module docstring).
    ``QROWS`` / ``DROWS``: the type's serial row-range quantizer and decoder; ``QK`` its block, ``TS`` its
    block bytes, ``SUB`` the columns fixed per step -- bound per type (``jit.specialize``)."""
    qk = QK  # noqa: F821
    sub = SUB  # noqa: F821
    ts = TS  # noqa: F821
    n = W.shape[1]
    nr = r1 - r0
    X = np.empty((nr, qk), dtype=np.float32)
    X0 = np.empty((nr, qk), dtype=np.float32)
    Q = np.empty((nr, qk), dtype=np.float32)
    Yb = np.empty((nr, ts), dtype=np.uint8)
    for c0 in range(0, n, qk):
        c1 = c0 + qk
        for r in range(nr):
            for j in range(qk):
                X[r, j] = W[r0 + r, c0 + j]
                X0[r, j] = X[r, j]
        wb = qw[c0:c1] if qw.shape[0] > 0 else qw
        for s0 in range(0, qk, sub):
            QROWS(X, Yb, wb, 0, nr)  # noqa: F821
            s1 = s0 + sub
            if s1 < qk:  # fix columns s0..s1-1, push their error into the block's later columns
                DROWS(Yb, Q, 0, nr)  # noqa: F821
                for r in range(nr):
                    xr = X[r]
                    for i in range(s0, s1):
                        e = xr[i] - Q[r, i]
                        pr = P[c0 + i]
                        for j in range(s1, qk):
                            xr[j] -= e * pr[c0 + j]
        DROWS(Yb, Q, 0, nr)  # noqa: F821
        bo = (c0 // qk) * ts
        for r in range(nr):
            for k in range(ts):
                Y[r0 + r, bo + k] = Yb[r, k]
            for j in range(qk):
                X0[r, j] -= Q[r, j]  # the block's final error, from its values when the sweep began
        for t0 in range(c1, n, _TILE):  # push it into every column right of the block
            t1 = min(n, t0 + _TILE)
            for i in range(qk):
                pr = P[c0 + i]
                for r in range(nr):
                    e = X0[r, i]
                    wr = W[r0 + r]
                    for j in range(t0, t1):
                        wr[j] -= e * pr[j]


def _sweep_kernel(cls, sub: int):
    return specialize(_sweep_body, f"{cls.qtype.name}_{sub}", QROWS=cls.quantize_rows.kernel,
                      DROWS=cls.dequantize_rows.kernel, QK=cls.block_size, TS=cls.type_size, SUB=sub)


def sweep(w: np.ndarray, qtype: T, P: np.ndarray, weights: np.ndarray | None, sub: int | None = None) -> np.ndarray:
    """The compensated quantization of ``w`` (float32 rows x n, not modified) to ``qtype``: its bytes
    (uint8 rows x row_bytes). ``P`` from ``factor`` with the type's block and step ``sub`` (default
    ``SUB_STEP``); ``weights`` the imatrix row llama-quantize would pass (or None)."""
    from quantkit.quants import traits

    cls = traits(qtype)
    if qtype not in SUPPORTED:
        raise ValueError(f"{qtype.name}: no compensated sweep for this type")
    sub = SUB_STEP[qtype] if sub is None else sub
    W = np.array(w, dtype=np.float32, order="C", copy=True)
    Y = np.empty((W.shape[0], cls.row_bytes(W.shape[1])), dtype=np.uint8)
    qw = np.zeros(0, np.float32) if weights is None or not cls.uses_imatrix \
        else np.ascontiguousarray(weights, dtype=np.float32)
    over_rows(_sweep_kernel(cls, sub), W.shape[0], W, Y, qw, np.ascontiguousarray(P, dtype=np.float32))
    return Y


def compensate(w: np.ndarray, qtype: T, h: np.ndarray, P: np.ndarray,
               weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, taken)``: ``w`` (float32 rows x n) quantized to ``qtype`` row by row as whichever of
    ``sweep`` and llama.cpp's plain rounding (``quantize`` with the same weights) has the lower
    ``e H e^T`` (``h`` the mean Gram matrix, float64), and which rows took the sweep's."""
    from quantkit.quants import dequantize, quantize

    base = quantize(w, qtype, weights)
    opt = sweep(w, qtype, P, weights)
    e_base = row_errors(w, dequantize(base, qtype), h)
    e_opt = row_errors(w, dequantize(opt, qtype), h)
    taken = e_opt < e_base * (1.0 - 1e-9)  # a near-tie keeps llama.cpp's bytes
    base[taken] = opt[taken]
    return base, taken


@njit
def _row_errors_kernel(w, q, h, out, r0, r1):
    """out[r] = e H e^T for e = q[r] - w[r], in float64: per tile of rows, ``t = H e`` as axpys over H's
    rows (each read once per tile; the loop over columns vectorizes), then ``e . t``; fixed order."""
    n = w.shape[1]
    for a in range(r0, r1, 16):
        b = min(r1, a + 16)
        e = np.empty((b - a, n), dtype=np.float64)
        t = np.zeros((b - a, n), dtype=np.float64)
        for r in range(a, b):
            for j in range(n):
                e[r - a, j] = np.float64(q[r, j]) - np.float64(w[r, j])
        for i in range(n):
            hi = h[i]
            for k in range(b - a):
                ei = e[k, i]
                tk = t[k]
                for j in range(n):
                    tk[j] += hi[j] * ei
        for k in range(b - a):
            s = 0.0
            for j in range(n):
                s += e[k, j] * t[k, j]
            out[a + k] = s


def row_errors(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each row's output error ``e H e^T`` (float64), ``e`` the row of ``q - w`` (both float32 rows x n)."""
    out = np.empty(w.shape[0], dtype=np.float64)
    over_rows(_row_errors_kernel, w.shape[0], np.ascontiguousarray(w), np.ascontiguousarray(q),
              np.ascontiguousarray(h, dtype=np.float64), out)
    return out
