"""The legacy 32-value types: Q4_0, Q5_0, Q8_0 (one fp16 scale ``d``) and Q4_1, Q5_1 (``d`` and a
minimum ``m``, ``x ~ d * q + m``).

Bit-exact with ggml's ``src/ggml-quants.c``, per ``ggml_quantize_chunk``'s dispatch:

* no importance matrix: ``quantize_row_{q4_0,q5_0,q8_0,q4_1,q5_1}_ref`` (``quantize_row_ref`` here);
* with one: ``quantize_row_{q4_0,q5_0,q4_1,q5_1}_impl`` -- a weighted scale search per block
  (``make_qx_quants`` for Q4_0 / Q5_0, ``make_qkx3_quants`` for Q4_1 / Q5_1, quants/search.py) with
  weights ``qw * sqrt(sigma2 + x^2)``, sigma2 the row's mean square. Q8_0 ignores the weights;
* ``dequantize_row_X`` equals ggml's and gguf-py's; the kernels decode rows with it too.

C's casts are kept: ``c_f2i`` is x86's truncating float -> int, ``wrap_i8`` the int8_t conversion and
``& 0xFF`` a store to uint8_t (quants/common.py), so even degenerate blocks give ggml's bytes.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.formats.ggml_types import type_info
from quantkit.jit import ld_u32, njit
from quantkit.quants.base import QuantType, build_kernel
from quantkit.quants.common import (absmax_signed, block_layout, c_f2i, c_roundf, imatrix_weight, ld_f16,
                                    put_f16, rt_len, sum_squares, wrap_i8)
from quantkit.quants.search import lanes, make_qkx2_quants_lanes, make_qx_quants_lanes

F32 = np.float32
QK = 32

_Q8_0_TS, _Q8_0_D, _Q8_0_QS = block_layout("Q8_0", "d", "qs")


# ---------------------------------------------------------------------------------------------
# what the types share: the weighted searches over a row, the 5-bit packing, the nibble decoder
# ---------------------------------------------------------------------------------------------
@njit
def _impl_search(x, qw, nmax, affine):
    """The ``quantize_row_X_impl`` searches of a whole row, every 32-block a lane, weights with the row's
    sigma2: ``make_qx_quants`` (rmse_type 1) or, ``affine``, ``make_qkx3_quants``. Returns the levels
    (LT[j, block]), the block scales and (affine) the negated minima."""
    sigma2 = F32(sum_squares(x) / F32(x.shape[0]))
    XT, WT, LT, AT, d = lanes(x, QK, np.uint8)
    for i in range(QK):
        for g in range(XT.shape[1]):
            WT[i, g] = imatrix_weight(qw[QK * g + i], XT[i, g], sigma2)
    the_min = np.empty_like(d)
    if affine:
        make_qkx2_quants_lanes(nmax, XT, WT, LT, AT, F32(-0.9), F32(0.05), 36, False, d, the_min)
    else:
        make_qx_quants_lanes(nmax, XT, WT, LT, AT, d)
    return LT, d, the_min


@njit(inline="always")
def _put_pair(y, qs, j, l0, l1, qh, five):
    """Levels ``l0`` (value j) and ``l1`` (value j + 16, j < 16) of a block: their low nibbles in byte
    ``qs + j`` (stored as C's uint8 would: a 4-bit type's level is not masked) and, ``five``, their fifth
    bits into ``qh`` (bit j of value j, bit j + 16 of value j + 16), which is returned."""
    if five:
        y[qs + j] = np.uint8((l0 & 0x0F) | ((l1 & 0x0F) << 4))
        qh |= np.uint32((l0 & 0x10) >> 4) << np.uint32(j)
        qh |= np.uint32((l1 & 0x10) >> 4) << np.uint32(j + 16)
    else:
        y[qs + j] = np.uint8((l0 | (l1 << 4)) & 0xFF)
    return qh


@njit(inline="always")
def _q5_levels(src, qs, qh, j):
    """The five-bit levels of values j and j + 16 (j < 16) of a block: nibbles in the bytes at ``qs``, fifth
    bits in the uint32 ``qh``."""
    q = np.int32(src[qs + j])
    h0 = np.int32(((qh >> np.uint32(j)) << np.uint32(4)) & np.uint32(0x10))
    h1 = np.int32((qh >> np.uint32(j + 12)) & np.uint32(0x10))
    return (q & 15) | h0, (q >> 4) | h1


# ---------------------------------------------------------------------------------------------
# the reference scale and levels of one block
# ---------------------------------------------------------------------------------------------
@njit(inline="always")
def _sym_ref_scale(xb, nmax):
    """``quantize_row_q{4,5}_0_ref``'s scale: ``d = max / -nmax`` (max the signed value of largest
    magnitude) and its inverse."""
    vmax, _ = absmax_signed(xb)
    d = F32(vmax / F32(-nmax))
    return d, (F32(F32(1.0) / d) if d != 0 else F32(0.0))


@njit(inline="always")
def _sym_ref_level(v, idl, nmax):
    """A level ``MIN(2 nmax - 1, (int8_t)(x / d + nmax + 0.5))`` as C's casts leave it."""
    return min(2 * nmax - 1, wrap_i8(c_f2i(F32(v * idl) + F32(nmax + 0.5)))) & 0xFF


@njit(inline="always")
def _affine_ref_scale(xb, nmax):
    """``quantize_row_q{4,5}_1_ref``'s grid from min to max: (d, min, 1/d)."""
    mn = F32(3.4028234663852886e38)
    mx = F32(-3.4028234663852886e38)
    for j in range(QK):
        v = xb[j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = (mx - mn) / F32(nmax)
    return d, mn, (F32(1.0) / d if d != F32(0.0) else F32(0.0))


@njit(inline="always")
def _affine_ref_level(v, mn, idd, nmax):
    """A level, round half up, as C's casts leave it: Q4_1 ``MIN(15, (int8_t) .)`` stored to uint8,
    Q5_1 ``(uint8_t) .``."""
    t = c_f2i((v - mn) * idd + F32(0.5))
    return (min(15, wrap_i8(t)) if nmax == 15 else t) & 0xFF


# ---------------------------------------------------------------------------------------------
# Q4_0, Q5_0, Q4_1, Q5_1: one row function and one decoder, built per type with its constants
# ---------------------------------------------------------------------------------------------
def _quantize_row_body(x, y, qw):
    """A row of Q4_0 / Q5_0 (levels -NMAX..NMAX-1 stored +NMAX, NMAX 8 / 16) or, ``AFFINE``, Q4_1 / Q5_1
    (levels 0..NMAX, NMAX 15 / 31): the reference levels, or with ``qw`` the weighted search's (every
    block's at once, one block per lane, bit-identical to ggml's block-by-block search: the
    latency-bound per-block loop made these types with an imatrix ~10x slower per value than Q4_K).
    Blocks of ``TS`` bytes: fp16 d, [fp16 m], [uint32 qh at ``QH_AT``, 5-bit types], nibbles at ``QS_AT``.
    The capitals are the type's constants, bound per type (``jit.specialize``), so each build's loops
    see literals as the per-type copies did; each pair of levels is stored as it is computed."""
    weighted = qw.shape[0] > 0
    if weighted:
        LT, scale, the_min = _impl_search(x, qw, NMAX, AFFINE)  # noqa: F821
    five = QH_AT >= 0  # noqa: F821
    for ib in range(x.shape[0] // QK):
        o = TS * ib  # noqa: F821
        qs = o + QS_AT  # noqa: F821
        xb = x[QK * ib:QK * (ib + 1)]
        qh = np.uint32(0)
        m = F32(0.0)
        if weighted:
            d = scale[ib]
            m = -the_min[ib]
            for j in range(16):
                qh = _put_pair(y, qs, j, np.int32(LT[j, ib]), np.int32(LT[j + 16, ib]), qh, five)
        elif AFFINE:  # noqa: F821
            d, m, idd = _affine_ref_scale(xb, NMAX)  # noqa: F821
            for j in range(16):
                qh = _put_pair(y, qs, j, _affine_ref_level(xb[j], m, idd, NMAX),  # noqa: F821
                               _affine_ref_level(xb[j + 16], m, idd, NMAX), qh, five)  # noqa: F821
        else:
            d, idl = _sym_ref_scale(xb, NMAX)  # noqa: F821
            for j in range(16):
                qh = _put_pair(y, qs, j, _sym_ref_level(xb[j], idl, NMAX),  # noqa: F821
                               _sym_ref_level(xb[j + 16], idl, NMAX), qh, five)  # noqa: F821
        put_f16(y, o, d)
        if AFFINE:  # noqa: F821
            put_f16(y, o + 2, m)
        if five:
            for k in range(4):
                y[o + QH_AT + k] = np.uint8((qh >> np.uint32(8 * k)) & np.uint32(0xFF))  # noqa: F821


def _dequantize_row_body(src, y):
    """ggml's ``dequantize_row_q{4,5}_{0,1}``: one row's bytes ``src`` -> float32 ``y`` (the codec's and the
    kernels' row decoder), ``(q - 8) * d`` / ``(q - 16) * d``, or ``q * d + m`` when ``AFFINE``; the
    constants as in ``_quantize_row_body``."""
    n16 = rt_len(16)
    for b in range(y.shape[0] // QK):
        o = TS * b  # noqa: F821
        d = ld_f16(src, o)
        m = ld_f16(src, o + 2) if AFFINE else F32(0.0)  # noqa: F821
        if QH_AT >= 0:  # the fifth bits  # noqa: F821
            qh = ld_u32(src, o + QH_AT)  # noqa: F821
            for j in range(16):
                l0, l1 = _q5_levels(src, o + QS_AT, qh, j)  # noqa: F821
                if AFFINE:  # noqa: F821
                    y[QK * b + j] = F32(l0) * d + m
                    y[QK * b + j + 16] = F32(l1) * d + m
                else:
                    y[QK * b + j] = F32(l0 - 16) * d
                    y[QK * b + j + 16] = F32(l1 - 16) * d
            continue
        qs = src[o + QS_AT:o + QS_AT + 16]  # noqa: F821
        yy = y[QK * b:QK * (b + 1)]
        if AFFINE:  # noqa: F821
            for j in range(n16):
                yy[j] = F32(np.int32(qs[j]) & 15) * d + m
            for j in range(n16):
                yy[j + 16] = F32(np.int32(qs[j]) >> 4) * d + m
        else:
            for j in range(n16):
                yy[j] = F32((np.int32(qs[j]) & 15) - 8) * d
            for j in range(n16):
                yy[j + 16] = F32((np.int32(qs[j]) >> 4) - 8) * d


class _Legacy(QuantType):
    """What Q4_0, Q5_0, Q4_1 and Q5_1 share: the row function and the decoder, each built for the type
    with its ``nmax`` and its fields (from the type table) as compile-time constants."""

    def __init_subclass__(cls, qtype: T, nmax: int) -> None:
        info = type_info(qtype)
        off = info.offsets
        k = dict(NMAX=nmax, TS=info.type_size, AFFINE="m" in off, QH_AT=off.get("qh", -1), QS_AT=off["qs"])
        cls.quantize_row = build_kernel(_quantize_row_body, qtype, False, **k)
        cls.dequantize_row = build_kernel(_dequantize_row_body, qtype, False, **k)
        super().__init_subclass__(qtype=qtype)


class Q4_0(_Legacy, qtype=T.Q4_0, nmax=8):
    """fp16 d, qs[16]: value j in the low nibble of byte j, value j + 16 in the high nibble."""


class Q5_0(_Legacy, qtype=T.Q5_0, nmax=16):
    """fp16 d, qh[4] (bit j: the fifth bit of value j), qs[16] (the low nibbles of the values, as in
    Q4_0)."""


class Q4_1(_Legacy, qtype=T.Q4_1, nmax=15):
    """fp16 d and m, qs[16] as Q4_0's; ``x ~ d * q + m``."""


class Q5_1(_Legacy, qtype=T.Q5_1, nmax=31):
    """fp16 d and m, then qh[4] and qs[16] as Q5_0's; ``x ~ d * q + m``, so all-positive blocks use every
    level."""


# ---------------------------------------------------------------------------------------------
# Q8_0: fp16 d, int8 qs[32]
# ---------------------------------------------------------------------------------------------
@njit
def quantize_row_q8_0_ref(x, y):
    for ib in range(x.shape[0] // QK):
        xb = x[ib * QK:(ib + 1) * QK]
        o = _Q8_0_TS * ib
        _, amax = absmax_signed(xb)
        d = np.float32(amax / np.float32(127.0))
        idl = np.float32(np.float32(1.0) / d) if d != 0 else np.float32(0.0)
        put_f16(y, o + _Q8_0_D, d)
        for j in range(QK):
            y[o + _Q8_0_QS + j] = np.uint8(c_f2i(c_roundf(xb[j] * idl)) & 0xFF)


@njit(inline="always")
def dequantize_block_q8_0(src, y):
    n32 = rt_len(32)
    d = ld_f16(src, _Q8_0_D)
    for j in range(n32):
        y[j] = np.float32(np.int8(src[_Q8_0_QS + j])) * d


class Q8_0(QuantType, qtype=T.Q8_0):
    """34 bytes per 32: fp16 d, int8 qs[32]."""
    uses_imatrix = False  # ggml's quantize_q8_0 ignores quant_weights
    quantize_row_ref = quantize_row_q8_0_ref
    dequantize_block = dequantize_block_q8_0
