"""Row dots of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) against Q8_K activations.

Each ``rowdot_X(wr, xq, xd, xs, sc) -> float32`` has the signature of kernels/vecdot.py's row dots
(one weight row's bytes, one token's planar Q8_K activations: int8 quants, float32 ``d`` per 256,
int32 ``bsums`` per 16; ``sc`` unused) and follows ggml's ``ggml_vec_dot_X_q8_K`` (ggml-cpu/quants.c):
per super-block one int32 sum of grid value * sign * activation, weighted by the small integer block
scales, then one float multiply-add with ``fp16(d) * y.d``. IQ1's shift ``delta = +-1/8`` enters through
the activations' 16-sums (``bsums``) for IQ1_S and through per-group sums for IQ1_M, as ggml does.

The grids (quants/grids.py, via gguf-py) are module constants, one uint64 per point, so numba bakes them
into the compiled code; a group of 8 is one 64-bit load, its signs applied with a byte-mask table
(``_signed``), and its dot with 8 activations one IR intrinsic (``_dot8``: sign-extend, multiply,
add-reduce -- a numba loop would widen every product to int64).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from quantkit.jit import njit, njit_fast
from quantkit.kernels.ir import _byte_ptr, _decl, _load, ld_f16
from quantkit.quants.common import fp16_to_fp32
from quantkit.quants.grids import grid_values

F = np.float32

_G_XXS = np.ascontiguousarray(grid_values(T.IQ2_XXS).astype(np.int8))
_G_XS = np.ascontiguousarray(grid_values(T.IQ2_XS).astype(np.int8))
_G_S = np.ascontiguousarray(grid_values(T.IQ2_S).astype(np.int8))
_G_1 = np.ascontiguousarray(grid_values(T.IQ1_S).astype(np.int8))
#: _SIGN[m, j] = -1 where bit j of the 8-bit mask m is set, else +1
_SIGN = np.where((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1, -1, 1).astype(np.int8)
#: the 8-bit mask of a 7-bit one whose implied 8th bit makes the count of set bits even (ksigns_iq2xs)
_KSIGNS = np.array([s | ((bin(s).count("1") & 1) << 7) for s in range(128)], dtype=np.int32)

#: the grids as one uint64 per point (byte j = coordinate j), so a group of 8 is one load and store
_G64_XXS = _G_XXS.view(np.uint64).reshape(-1)
_G64_XS = _G_XS.view(np.uint64).reshape(-1)
_G64_S = _G_S.view(np.uint64).reshape(-1)
_G64_1 = _G_1.view(np.uint64).reshape(-1)
#: _NEG64[m]: 0xFF in byte j where bit j of m is set; ``(v ^ M) + (M & 0x01..01)`` negates those bytes of
#: a group of positive grid values (no carry between bytes: 255 - v + 1 <= 255 for v >= 1)
_NEG64 = np.array([sum(0xFF << (8 * j) for j in range(8) if (m >> j) & 1) for m in range(256)], dtype=np.uint64)
_ONES64 = np.uint64(0x0101010101010101)



@njit_fast
def _signed(g64, mask8):
    """A group's 8 grid bytes with the lanes of ``mask8`` negated."""
    m = _NEG64[mask8]
    return (g64 ^ m) + (m & _ONES64)


@intrinsic
def _dot8(typingctx, w64, x, xoff):
    """int32 sum over 8 lanes of the int8 bytes of ``w64`` (a uint64 in a register: a grid point, byte j
    = lane j) times int8 ``x[xoff + j]``: no store and reload of the weights."""
    sig = types.int32(w64, x, xoff)

    def codegen(context, builder, signature, args):
        v8 = ir.VectorType(ir.IntType(8), 8)
        v32 = ir.VectorType(ir.IntType(32), 8)
        wa = builder.sext(builder.bitcast(args[0], v8), v32)
        pb = _byte_ptr(context, builder, signature.args[1], args[1], args[2], signature.args[2])
        xb = builder.sext(_load(builder, pb, 0, v8), v32)
        red = _decl(builder.module, "llvm.vector.reduce.add.v8i32", ir.IntType(32), [v32])
        return builder.call(red, [builder.mul(wa, xb)])

    return sig, codegen


@njit_fast
def rowdot_iq2_xxs(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for i in range(wr.shape[0] // 66):
        p = 66 * i
        d = ld_f16(wr, p) * xd[i]
        bsum = np.int32(0)
        for ib in range(8):
            a = p + 2 + 8 * ib
            aux1 = (np.int64(wr[a + 4]) | (np.int64(wr[a + 5]) << 8) | (np.int64(wr[a + 6]) << 16)
                    | (np.int64(wr[a + 7]) << 24))
            sumi = np.int32(0)
            for l in range(4):
                g = _signed(_G64_XXS[wr[a + l]], _KSIGNS[(aux1 >> (7 * l)) & 127])
                sumi += _dot8(g, xq, 256 * i + 32 * ib + 8 * l)
            bsum += sumi * np.int32(2 * (aux1 >> 28) + 1)
        sumf += d * F(bsum)
    return F(0.125) * sumf


@njit_fast
def rowdot_iq2_xs(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for i in range(wr.shape[0] // 74):
        p = 74 * i
        d = ld_f16(wr, p) * xd[i]
        bsum = np.int32(0)
        for ib in range(8):
            s8 = np.int32(wr[p + 66 + ib])
            for h in range(2):
                sumi = np.int32(0)
                for l in range(2 * h, 2 * h + 2):
                    a = p + 2 + 8 * ib + 2 * l
                    v = np.int32(wr[a]) | (np.int32(wr[a + 1]) << 8)
                    sumi += _dot8(_signed(_G64_XS[v & 511], _KSIGNS[v >> 9]), xq, 256 * i + 32 * ib + 8 * l)
                bsum += sumi * (2 * ((s8 >> (4 * h)) & 0xF) + 1)
        sumf += d * F(bsum)
    return F(0.125) * sumf


@njit_fast
def rowdot_iq2_s(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for i in range(wr.shape[0] // 82):
        p = 82 * i
        d = ld_f16(wr, p) * xd[i]
        bsum = np.int32(0)
        for ib in range(8):
            s8 = np.int32(wr[p + 74 + ib])
            qh = np.int32(wr[p + 66 + ib])
            for h in range(2):
                sumi = np.int32(0)
                for l in range(2 * h, 2 * h + 2):
                    g = 4 * ib + l
                    gi = np.int32(wr[p + 2 + g]) | ((qh << (8 - 2 * l)) & 0x300)
                    sumi += _dot8(_signed(_G64_S[gi], wr[p + 34 + g]), xq, 256 * i + 8 * g)
                bsum += sumi * (2 * ((s8 >> (4 * h)) & 0xF) + 1)
        sumf += d * F(bsum)
    return F(0.125) * sumf


@njit_fast
def rowdot_iq1_s(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for i in range(wr.shape[0] // 50):
        p = 50 * i
        sumi = np.int32(0)
        sumi1 = np.int32(0)
        for ib in range(8):
            qh = np.int32(wr[p + 34 + 2 * ib]) | (np.int32(wr[p + 35 + 2 * ib]) << 8)
            ls = 2 * ((qh >> 12) & 7) + 1
            lsum = np.int32(0)
            for l in range(4):
                gi = np.int32(wr[p + 2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)
                lsum += _dot8(_G64_1[gi], xq, 256 * i + 32 * ib + 8 * l)
            sumi += ls * lsum
            t = xs[16 * i + 2 * ib] + xs[16 * i + 2 * ib + 1]  # the activations' sum over the 32
            sumi1 += ls * (-t if qh & 0x8000 else t)
        sumf += ld_f16(wr, p) * xd[i] * (F(sumi) + F(0.125) * F(sumi1))
    return sumf


@njit_fast
def rowdot_iq1_m(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for i in range(wr.shape[0] // 56):
        p = 56 * i
        u = 0
        for k in range(4):
            u |= ((np.int32(wr[p + 49 + 2 * k]) >> 4) & 0xF) << (4 * k)
        sumi1 = np.int32(0)
        sumi2 = np.int32(0)
        for b in range(16):  # blocks of 16: one 3-bit scale, a delta sign per group of 8
            w16 = np.int32(wr[p + 48 + 2 * (b // 4)]) | (np.int32(wr[p + 49 + 2 * (b // 4)]) << 8)
            ls = 2 * ((w16 >> (3 * (b % 4))) & 7) + 1
            qh = np.int32(wr[p + 32 + b])
            s1 = np.int32(0)
            s2 = np.int32(0)
            for h in range(2):
                nib = (qh >> (4 * h)) & 0xF
                o = 256 * i + 16 * b + 8 * h
                s1 += _dot8(_G64_1[np.int32(wr[p + 2 * b + h]) | ((nib & 7) << 8)], xq, o)
                t = _dot8(_ONES64, xq, o)  # the 8 activations' sum
                s2 += -t if nib & 8 else t
            sumi1 += s1 * ls
            sumi2 += s2 * ls
        sumf += fp16_to_fp32(np.uint16(u)) * xd[i] * (F(sumi1) + F(0.125) * F(sumi2))
    return sumf


#: weight type -> its row dot (vecdot.KERNEL_TRAITS takes them in; the activations are the type table's
#: vec_dot_type, Q8_K, and the row decoder of the portable path is the codec's ``dequantize_row``)
IQ_ROWDOTS = {
    T.IQ2_XXS: rowdot_iq2_xxs,
    T.IQ2_XS: rowdot_iq2_xs,
    T.IQ2_S: rowdot_iq2_s,
    T.IQ1_S: rowdot_iq1_s,
    T.IQ1_M: rowdot_iq1_m,
}
