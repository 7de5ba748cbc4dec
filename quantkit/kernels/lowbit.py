"""Row dots for TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS and IQ3_S weights, as ggml-cpu's ``vec_dot_X_Y``.

Same contract as vecdot.py's row dots: ``rowdot_X(wr, xq, xd, xs, sc) -> float32`` takes one weight
row's bytes ``wr`` (1-D uint8) and one token's planar activations of the type's vec_dot type
(activations.py: ``xq`` int8 quants, ``xd`` float32 block scales, ``xs`` int32 group sums; ``sc`` is
unused here). Integer sums per block (exact), then one float multiply-add per block in ggml's order:

* TQ1_0 / TQ2_0 . Q8_K (``ggml_vec_dot_tq1_0_q8_K``, ``_tq2_0_q8_K``): ``sum((t - 1) * q)``, computed as
  ``sum(t * q) - sum(q)`` with ``sum(q)`` from the activation's bsums; ``sumf += sumi * (d_w * d_a)``;
* MXFP4 . Q8_0 (``ggml_vec_dot_mxfp4_q8_0``): ``sumf += (d_a * 2^(e-128)) * sum(E[i] * q)``;
* Q1_0 . Q8_0 (``ggml_vec_dot_q1_0_q8_0``): per 32 values ``sum(+-q) = 2 * sum(bit * q) - sum(q)``,
  ``sumi += d_a * that``, then ``sumf += d_w * sumi`` per 128;
* IQ3_XXS / IQ3_S . Q8_K (``ggml_vec_dot_iq3_xxs_q8_K``, ``_iq3_s_q8_K``): signed grid values times
  the quants, times the odd sub-block scale ``2s + 1`` as integers, ``sumf += (d_w * d_a) * bsum``;
  IQ3_XXS's total times 0.25.

Like ggml's, these sums are exact in the integer parts; only the per-block float products round, so a
row dot equals the float64 dot of the dequantized operands to float32 rounding (tests/test_kernels_lowbit.py).
"""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit_fast
from quantkit.quants.common import get_f16
from quantkit.quants.iq3 import GRID_IQ3_S, GRID_IQ3_XXS, parity7
from quantkit.quants.mxfp4 import KVALUES_MXFP4, e8m0_to_fp32_half

F = np.float32
_KV_MXFP4 = KVALUES_MXFP4.astype(np.int32)
_G3XXS = GRID_IQ3_XXS.astype(np.int32)
_G3S = GRID_IQ3_S.astype(np.int32)


@njit_fast
def _bsum256(xs, ib):
    """Sum of the 256 activation quants of block ``ib`` (its 16 bsums)."""
    s = 0
    for g in range(16):
        s += xs[16 * ib + g]
    return s


@njit_fast
def rowdot_tq2_0(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 256):
        p = 66 * ib
        o = 256 * ib
        acc = 0
        for j in range(2):
            for n in range(4):
                for m in range(32):
                    acc += ((np.int32(wr[p + 32 * j + m]) >> (2 * n)) & 3) * np.int32(xq[o + 128 * j + 32 * n + m])
        sumi = acc - _bsum256(xs, ib)
        sumf += F(sumi) * (xd[ib] * get_f16(wr, p + 64))
    return sumf


@njit_fast
def _trit(b, p3):
    """Trit of a TQ1_0 byte (0..2) whose position has weight ``p3`` = 3**n."""
    return (((np.int32(b) * p3) & 255) * 3) >> 8


@njit_fast
def rowdot_tq1_0(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 256):
        p = 54 * ib
        o = 256 * ib
        acc = 0
        p3 = 1
        for n in range(5):
            for m in range(32):
                acc += _trit(wr[p + m], p3) * np.int32(xq[o + 32 * n + m])
            for m in range(16):
                acc += _trit(wr[p + 32 + m], p3) * np.int32(xq[o + 160 + 16 * n + m])
            if n < 4:
                for j in range(4):
                    acc += _trit(wr[p + 48 + j], p3) * np.int32(xq[o + 240 + 4 * n + j])
            p3 *= 3
        sumi = acc - _bsum256(xs, ib)
        sumf += F(sumi) * (get_f16(wr, p + 52) * xd[ib])
    return sumf


@njit_fast
def rowdot_mxfp4(wr, xq, xd, xs, sc):
    kv = _KV_MXFP4
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 32):
        p = 17 * ib
        o = 32 * ib
        acc = 0
        for j in range(16):
            b = np.int32(wr[p + 1 + j])
            acc += kv[b & 15] * np.int32(xq[o + j]) + kv[b >> 4] * np.int32(xq[o + 16 + j])
        sumf += (xd[ib] * e8m0_to_fp32_half(wr[p])) * F(acc)
    return sumf


@njit_fast
def rowdot_q1_0(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 128):
        p = 18 * ib
        sumi = F(0.0)
        for k in range(4):
            o = 128 * ib + 32 * k
            acc = 0
            for j in range(32):
                acc += ((np.int32(wr[p + 2 + 4 * k + j // 8]) >> (j % 8)) & 1) * np.int32(xq[o + j])
            sumi += xd[4 * ib + k] * F(2 * acc - xs[4 * ib + k])
        sumf += get_f16(wr, p) * sumi
    return sumf


@njit_fast
def _signed_dot8(grid, g1, g2, signs, xq, o):
    """sum over 8 values of +-grid * q: points g1, g2 (4 values each), sign bit j negates value j."""
    acc = 0
    for j in range(4):
        v1 = grid[g1, j] * np.int32(xq[o + j])
        v2 = grid[g2, j] * np.int32(xq[o + 4 + j])
        s1 = (signs >> j) & 1
        s2 = (signs >> (j + 4)) & 1
        acc += ((v1 ^ -s1) + s1) + ((v2 ^ -s2) + s2)
    return acc


@njit_fast
def rowdot_iq3_xxs(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ibl in range(xq.shape[0] // 256):
        p = 98 * ibl
        bsum = 0
        for ib in range(8):
            a = p + 66 + 4 * ib
            aux = (np.int64(wr[a]) | (np.int64(wr[a + 1]) << 8) | (np.int64(wr[a + 2]) << 16)
                   | (np.int64(wr[a + 3]) << 24))
            sumi = 0
            for l in range(4):
                s7 = np.int32((aux >> (7 * l)) & 127)
                q = p + 2 + 8 * ib + 2 * l
                sumi += _signed_dot8(_G3XXS, wr[q], wr[q + 1], s7 | (parity7(s7) << 7), xq,
                                     256 * ibl + 32 * ib + 8 * l)
            bsum += sumi * np.int32(2 * (aux >> 28) + 1)
        sumf += (get_f16(wr, p) * xd[ibl]) * F(bsum)
    return F(0.25) * sumf


@njit_fast
def rowdot_iq3_s(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ibl in range(xq.shape[0] // 256):
        p = 110 * ibl
        bsum = 0
        for ib in range(8):
            ls = 2 * ((np.int32(wr[p + 106 + ib // 2]) >> (4 * (ib % 2))) & 15) + 1
            qh = np.int32(wr[p + 66 + ib])
            sumi = 0
            for l in range(4):
                q = p + 2 + 8 * ib + 2 * l
                g1 = np.int32(wr[q]) | (((qh >> (2 * l)) & 1) << 8)
                g2 = np.int32(wr[q + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
                sumi += _signed_dot8(_G3S, g1, g2, np.int32(wr[p + 74 + 4 * ib + l]), xq, 256 * ibl + 32 * ib + 8 * l)
            bsum += sumi * ls
        sumf += (get_f16(wr, p) * xd[ibl]) * F(bsum)
    return sumf


#: weight type name -> (row dot, activation kind = ggml's vec_dot_type)
ROWDOTS = {
    "TQ1_0": (rowdot_tq1_0, "Q8_K"),
    "TQ2_0": (rowdot_tq2_0, "Q8_K"),
    "MXFP4": (rowdot_mxfp4, "Q8_0"),
    "Q1_0": (rowdot_q1_0, "Q8_0"),
    "IQ3_XXS": (rowdot_iq3_xxs, "Q8_K"),
    "IQ3_S": (rowdot_iq3_s, "Q8_K"),
}
