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

Two forms. ``rowdot_X`` above are plain numba (numba types integer arithmetic as int64, so they run
scalar or in 64-bit lanes: ~0.5-2 GB/s); they are the readable statement of each dot and the reference
the fast form is tested against. ``SPECS`` are the same dots as per-block LLVM-IR emitters for ir.py's
whole-row loop (``ir.ROW_SPECS``: u8 x s8 chunks through ``vpdpbusd``), registered on import:

* TQ2_0 reuses Q2_K's 2-bit chunk loader (the same ``qs`` layout), TQ1_0 decodes trits with byte
  multiplies (``(b * 3**n mod 256) * 3 >> 8``), both subtract ``sum(q)`` from the bsums;
* MXFP4 looks its nibbles up in ``E + 128`` (``vpshufb``) and subtracts ``128 * sum(q)``;
* IQ3_XXS / IQ3_S load eight 4-byte grid points per 32 values from a constant table (as ggml's AVX2
  dot does with ``_mm256_set_epi32``), apply the signs to the activations and scale each 32-chunk by
  ``2s + 1`` (``vpmaddubsw`` + ``vpdpwssd``).

Q1_0 (128 values per block against four Q8_0 scales) does not fit that one-activation-scale-per-block
loop: its numba dot takes each 32-value bit mask through one small IR intrinsic (``_bits_dot32``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.jit import byte_ptr, njit_fast
from quantkit.kernels import ir as K
from quantkit.quants.common import block_layout, get_f16
from quantkit.quants.iq3 import GRID_IQ3_S, GRID_IQ3_XXS, parity7
from quantkit.quants.mxfp4 import KVALUES_MXFP4, e8m0_to_fp32_half

F = np.float32
_TQ1_TS, _TQ1_QS, _TQ1_QH, _TQ1_D = block_layout("TQ1_0", "qs", "qh", "d")
_TQ2_TS, _TQ2_QS, _TQ2_D = block_layout("TQ2_0", "qs", "d")
_MX_TS, _MX_E, _MX_QS = block_layout("MXFP4", "e", "qs")
_Q1_TS, _Q1_D, _Q1_QS = block_layout("Q1_0", "d", "qs")
_XXS_TS, _XXS_D, _XXS_QS = block_layout("IQ3_XXS", "d", "qs")
_XXS_SAS = _XXS_QS + 64  # IQ3_XXS: the uint32 signs-and-scale words, the last 32 bytes of qs
_S_TS, _S_D, _S_QS, _S_QH, _S_SIGNS, _S_SCALES = block_layout("IQ3_S", "d", "qs", "qh", "signs", "scales")
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
        p = _TQ2_TS * ib
        o = 256 * ib
        acc = 0
        for j in range(2):
            for n in range(4):
                for m in range(32):
                    acc += ((np.int32(wr[p + _TQ2_QS + 32 * j + m]) >> (2 * n)) & 3) * np.int32(xq[o + 128 * j + 32 * n + m])
        sumi = acc - _bsum256(xs, ib)
        sumf += F(sumi) * (xd[ib] * get_f16(wr, p + _TQ2_D))
    return sumf


@njit_fast
def _trit(b, p3):
    """Trit of a TQ1_0 byte (0..2) whose position has weight ``p3`` = 3**n."""
    return (((np.int32(b) * p3) & 255) * 3) >> 8


@njit_fast
def rowdot_tq1_0(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 256):
        p = _TQ1_TS * ib
        o = 256 * ib
        acc = 0
        p3 = 1
        for n in range(5):
            for m in range(32):
                acc += _trit(wr[p + m], p3) * np.int32(xq[o + 32 * n + m])
            for m in range(16):
                acc += _trit(wr[p + _TQ1_QS + 32 + m], p3) * np.int32(xq[o + 160 + 16 * n + m])
            if n < 4:
                for j in range(4):
                    acc += _trit(wr[p + _TQ1_QH + j], p3) * np.int32(xq[o + 240 + 4 * n + j])
            p3 *= 3
        sumi = acc - _bsum256(xs, ib)
        sumf += F(sumi) * (get_f16(wr, p + _TQ1_D) * xd[ib])
    return sumf


@njit_fast
def rowdot_mxfp4(wr, xq, xd, xs, sc):
    kv = _KV_MXFP4
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 32):
        p = _MX_TS * ib
        o = 32 * ib
        acc = 0
        for j in range(16):
            b = np.int32(wr[p + _MX_QS + j])
            acc += kv[b & 15] * np.int32(xq[o + j]) + kv[b >> 4] * np.int32(xq[o + 16 + j])
        sumf += (xd[ib] * e8m0_to_fp32_half(wr[p + _MX_E])) * F(acc)
    return sumf


@intrinsic
def _bits_dot32(typingctx, wr, woff, xq, xoff):
    """sum of the int8 ``xq[xoff:xoff+32]`` whose bit is set in the 32-bit mask at byte ``woff`` of
    ``wr`` (bit j of the little-endian word for value j), as one u8 x s8 chunk dot (vpdpbusd)."""
    sig = types.int32(wr, woff, xq, xoff)

    def codegen(context, builder, signature, args):
        ta = signature.args
        wp = byte_ptr(context, builder, ta[0], args[0], args[1], ta[1])
        xp = byte_ptr(context, builder, ta[2], args[2], args[3], ta[3])
        bits = K._bits_to_bytes(builder, builder.load(builder.bitcast(wp, K.I32.as_pointer()), align=1), 0)
        x = builder.load(builder.bitcast(xp, K.V32I8.as_pointer()), align=1)
        return K._reduce(builder, K._dot(builder, "vnni" if K.HAS_VNNI else "generic", None, bits, x))

    return sig, codegen


@njit_fast
def rowdot_q1_0(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ib in range(xq.shape[0] // 128):
        p = _Q1_TS * ib
        sumi = F(0.0)
        for k in range(4):
            acc = _bits_dot32(wr, p + _Q1_QS + 4 * k, xq, 128 * ib + 32 * k)  # sum of q where the bit is set
            sumi += xd[4 * ib + k] * F(2 * acc - xs[4 * ib + k])  # sum(+-q) = 2 * that - sum(q)
        sumf += get_f16(wr, p + _Q1_D) * sumi
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
        p = _XXS_TS * ibl
        bsum = 0
        for ib in range(8):
            a = p + _XXS_SAS + 4 * ib
            aux = (np.int64(wr[a]) | (np.int64(wr[a + 1]) << 8) | (np.int64(wr[a + 2]) << 16)
                   | (np.int64(wr[a + 3]) << 24))
            sumi = 0
            for l in range(4):
                s7 = np.int32((aux >> (7 * l)) & 127)
                q = p + _XXS_QS + 8 * ib + 2 * l
                sumi += _signed_dot8(_G3XXS, wr[q], wr[q + 1], s7 | (parity7(s7) << 7), xq,
                                     256 * ibl + 32 * ib + 8 * l)
            bsum += sumi * np.int32(2 * (aux >> 28) + 1)
        sumf += (get_f16(wr, p + _XXS_D) * xd[ibl]) * F(bsum)
    return F(0.25) * sumf


@njit_fast
def rowdot_iq3_s(wr, xq, xd, xs, sc):
    sumf = F(0.0)
    for ibl in range(xq.shape[0] // 256):
        p = _S_TS * ibl
        bsum = 0
        for ib in range(8):
            ls = 2 * ((np.int32(wr[p + _S_SCALES + ib // 2]) >> (4 * (ib % 2))) & 15) + 1
            qh = np.int32(wr[p + _S_QH + ib])
            sumi = 0
            for l in range(4):
                q = p + _S_QS + 8 * ib + 2 * l
                g1 = np.int32(wr[q]) | (((qh >> (2 * l)) & 1) << 8)
                g2 = np.int32(wr[q + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
                sumi += _signed_dot8(_G3S, g1, g2, np.int32(wr[p + _S_SIGNS + 4 * ib + l]), xq, 256 * ibl + 32 * ib + 8 * l)
            bsum += sumi * ls
        sumf += (get_f16(wr, p + _S_D) * xd[ibl]) * F(bsum)
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


# -- LLVM-IR block emitters for ir.py's row loop ---------------------------------------------------
# Each: (blk, acc <8 x float>, extra float) -> (acc, extra), as ir.py's own emitters.

_V16I32 = ir.VectorType(K.I32, 16)
_V8I8 = ir.VectorType(K.I8, 8)


def _scale(b, blk, off):
    """d_w (fp16 at ``off``) * d_a, the block's float scale."""
    return b.fmul(K._f16(b, blk.wb, off), blk.dx, flags=K._FM)


def _minus_bsums(b, blk, ai):
    """ai - sum of the block's 16 activation bsums (spread over the lanes; only the lane total counts)."""
    return b.sub(ai, K._fold16(b, blk.bsums()))


def _emit_tq2_0(blk, acc, extra):
    b = blk.b
    ai = None
    for c in range(8):  # chunk c: elements 128 * (c // 4) + 32 * (c % 4) + m, Q2_K's qs layout
        ai = K._dot(b, blk.v, ai, K._chunk_q2_k(b, blk.v, K._gep(b, blk.wb, _TQ2_QS), c), K._ld(b, blk.xb, 32 * c, K.V32I8))
    return K._fma_acc(b, acc, _minus_bsums(b, blk, ai), _scale(b, blk, _TQ2_D)), extra


def _trits(b, v, pow3):
    """Trits (0..2) of TQ1_0 bytes ``v`` (<n x i8>) at the positions of weight ``pow3`` (one int or one
    per lane): the top base-3 digit of ``v * pow3 mod 256``."""
    n = v.type.count
    m = pow3 if isinstance(pow3, (list, tuple)) else [pow3] * n
    q = b.zext(b.mul(v, K._vconst(m, K.I8)), ir.VectorType(K.I16, n))
    t = b.lshr(b.mul(q, K._vconst([3] * n, K.I16)), K._vconst([8] * n, K.I16))
    return b.trunc(t, ir.VectorType(K.I8, n))


def _emit_tq1_0(blk, acc, extra):
    b = blk.b
    v32 = K._ld(b, blk.wb, _TQ1_QS, K.V32I8)   # qs[0:32]: elements 32n + m
    v16 = K._ld(b, blk.wb, _TQ1_QS + 32, K.V16I8)  # qs[32:48]: elements 160 + 16n + m
    qh = K._ld(b, blk.wb, _TQ1_QH, ir.VectorType(K.I8, 4))  # qh[4]: elements 240 + 4n + j
    qh16 = b.shuffle_vector(qh, qh, K._vconst([0, 1, 2, 3] * 4))
    chunks = [_trits(b, v32, 3 ** n) for n in range(5)]
    chunks.append(K._concat16(b, _trits(b, v16, 1), _trits(b, v16, 3)))
    chunks.append(K._concat16(b, _trits(b, v16, 9), _trits(b, v16, 27)))
    chunks.append(K._concat16(b, _trits(b, v16, 81), _trits(b, qh16, [1] * 4 + [3] * 4 + [9] * 4 + [27] * 4)))
    ai = None
    for c in range(8):
        ai = K._dot(b, blk.v, ai, chunks[c], K._ld(b, blk.xb, 32 * c, K.V32I8))
    return K._fma_acc(b, acc, _minus_bsums(b, blk, ai), _scale(b, blk, _TQ1_D)), extra


_MXFP4_U = tuple((int(v) + 128) & 0xFF for v in KVALUES_MXFP4)  # offset by 128 -> unsigned


def _emit_mxfp4(blk, acc, extra):
    b = blk.b
    e = b.zext(K._ld(b, blk.wb, _MX_E, K.I8), K.I32)
    small = b.icmp_unsigned("<", e, ir.Constant(K.I32, 2))
    sub = b.sub(b.select(small, ir.Constant(K.I32, 1), e), ir.Constant(K.I32, 1))
    bits = b.select(small, b.shl(ir.Constant(K.I32, 0x00200000), e), b.shl(sub, ir.Constant(K.I32, 23)))
    scale = b.fmul(blk.dx, b.bitcast(bits, K.F32T), flags=K._FM)  # d_a * GGML_E8M0_TO_FP32_HALF(e)
    xsum = K._ld(b, blk.sb, 0, K.I32)
    neg = b.sub(ir.Constant(K.I32, 0), b.shl(xsum, ir.Constant(K.I32, 7)))
    init = b.insert_element(ir.Constant(K.V8I32, None), neg, ir.Constant(K.I32, 0))
    u = K._lut16(b, blk.v, K._nibbles16(b, blk.wb, _MX_QS), _MXFP4_U)
    t = K._dot(b, blk.v, init, u, K._ld(b, blk.xb, 0, K.V32I8))
    return K._fma_acc(b, acc, t, scale), extra


def _grid_table(b, name, grid):
    """The grid as a constant global of one little-endian word per point (its 4 or 8 byte values: i32 or
    i64), so a group's values are one scalar load."""
    width = grid.shape[1]
    ty = ir.IntType(8 * width)
    words = [int(w) for w in np.ascontiguousarray(grid.astype(np.uint8)).view(f"<u{width}").ravel()]
    arr = ir.ArrayType(ty, len(words))
    gv = b.module.globals.get(name)
    if gv is None:
        gv = cgutils.global_constant(b.module, name, ir.Constant(arr, words))
    return gv


def _gather(b, table, idx, lanes):
    """<n x word> of table[i] for the i32 elements ``lanes`` of the index vector ``idx``: scalar loads
    (measured 20 % faster per core than AVX2's ``vpgatherdd`` for IQ3_XXS on the Zen 5 test machine, as
    ggml's AVX2 dots also do with ``_mm256_set_epi32`` / ``_mm256_set_epi64x``)."""
    vty = ir.VectorType(table.type.pointee.element, len(lanes))
    out = ir.Constant(vty, None)
    zero = ir.Constant(K.I32, 0)
    for n, i in enumerate(lanes):
        j = b.extract_element(idx, ir.Constant(K.I32, i))
        out = b.insert_element(out, b.load(b.gep(table, [zero, j])), ir.Constant(K.I32, n))
    return out


def _signed_chunk_dot(b, blk, acc, grid_words, signs32, c, ls):
    """acc + ls * (chunk c's unsigned weight bytes ``grid_words`` (any 32-byte vector) . activations),
    bit j of ``signs32`` (or None) negating activation j. ``ls``: one i32 scale for the 32 values, or a
    pair (first 16, last 16). vnni: ``vpmaddubsw`` then ``vpdpwssd`` with the scales (weights < 64, so
    the pairs fit int16), as ir.py's ``_scaled_chunks``; elsewhere a u8 x s8 dot times the scales."""
    x = K._ld(b, blk.xb, 32 * c, K.V32I8)
    if signs32 is not None:
        neg = b.bitcast(signs32, ir.VectorType(ir.IntType(1), 32))
        x = b.select(neg, b.sub(ir.Constant(K.V32I8, None), x), x)
    u = b.bitcast(grid_words, K.V32I8)
    lo, hi = ls if isinstance(ls, tuple) else (ls, ls)
    if blk.v == "vnni":
        mad = K._decl(b.module, "llvm.x86.avx2.pmadd.ub.sw", K.V16I16, [K.V32I8, K.V32I8])
        dpw = K._decl(b.module, "llvm.x86.avx512.vpdpwssd.256", K.V8I32, [K.V8I32, K.V8I32, K.V8I32])
        lv = b.insert_element(ir.Constant(K.V16I16, None), b.trunc(lo, K.I16), ir.Constant(K.I32, 0))
        lv = b.insert_element(lv, b.trunc(hi, K.I16), ir.Constant(K.I32, 1))
        lv = b.shuffle_vector(lv, lv, K._vconst([0] * 8 + [1] * 8))
        p16 = b.call(mad, [u, x])
        return b.call(dpw, [acc, b.bitcast(p16, K.V8I32), b.bitcast(lv, K.V8I32)])
    t = K._dot(b, blk.v, None, u, x)
    lv = b.insert_element(ir.Constant(K.V8I32, None), lo, ir.Constant(K.I32, 0))
    lv = K._shuf(b, b.insert_element(lv, hi, ir.Constant(K.I32, 1)), [0] * 4 + [1] * 4)
    return b.add(acc, b.mul(t, lv))


def _xxs_signs(b, aux):
    """IQ3_XXS's four 7-bit sign groups (bits 0..27 of each lane of ``aux``, <8 x i32>: the eight
    sub-blocks at once) -> their 32 sign bits, each byte's eighth bit the parity of its seven (ggml's
    ``ksigns_iq2xs``): spread the groups to bytes, then fold each byte's parity into its bit 0 with three
    shift-xors (bits never cross a byte there)."""
    c = lambda v: K._vconst([v] * 8)  # noqa: E731
    m = b.and_(aux, c(0x7F))
    for l in (1, 2, 3):
        m = b.or_(m, b.and_(b.shl(aux, c(l)), c(0x7F << (8 * l))))
    p = b.xor(m, b.lshr(m, c(4)))
    p = b.xor(p, b.lshr(p, c(2)))
    p = b.xor(p, b.lshr(p, c(1)))
    return b.or_(m, b.shl(b.and_(p, c(0x01010101)), c(7)))


def _emit_iq3_xxs(blk, acc, extra):
    b = blk.b
    table = _grid_table(b, "quantkit_iq3xxs_grid", GRID_IQ3_XXS)
    ai = ir.Constant(K.V8I32, None)
    aux = K._ld(b, blk.wb, _XXS_SAS, K.V8I32)  # the eight sub-blocks' words, decoded in one go
    masks = _xxs_signs(b, aux)
    lss = b.add(b.shl(b.lshr(aux, K._vconst([28] * 8)), K._vconst([1] * 8)), K._vconst([1] * 8))
    for c in range(8):
        idx = b.zext(K._ld(b, blk.wb, _XXS_QS + 8 * c, _V8I8), K.V8I32)
        mask = b.extract_element(masks, ir.Constant(K.I32, c))
        ls = b.extract_element(lss, ir.Constant(K.I32, c))
        ai = _signed_chunk_dot(b, blk, ai, _gather(b, table, idx, range(8)), mask, c, ls)
    scale = b.fmul(_scale(b, blk, _XXS_D), ir.Constant(K.F32T, 0.25), flags=K._FM)
    return K._fma_acc(b, acc, ai, scale), extra


def _emit_iq3_s(blk, acc, extra):
    b = blk.b
    table = _grid_table(b, "quantkit_iq3s_grid", GRID_IQ3_S)
    ai = ir.Constant(K.V8I32, None)
    for c in range(8):
        lo = b.zext(K._ld(b, blk.wb, _S_QS + 8 * c, _V8I8), K.V8I32)
        qh = b.zext(K._ld(b, blk.wb, _S_QH + c, K.I8), K.I32)
        qhv = K._shuf(b, b.insert_element(ir.Constant(K.V8I32, None), qh, ir.Constant(K.I32, 0)), [0] * 8)
        hi = b.shl(b.and_(b.lshr(qhv, K._vconst(range(8))), K._vconst([1] * 8)), K._vconst([8] * 8))
        signs = K._ld(b, blk.wb, _S_SIGNS + 4 * c, K.I32)
        sc = b.zext(K._ld(b, blk.wb, _S_SCALES + c // 2, K.I8), K.I32)
        s4 = b.and_(b.lshr(sc, ir.Constant(K.I32, 4 * (c % 2))), ir.Constant(K.I32, 15))
        ls = b.add(b.shl(s4, ir.Constant(K.I32, 1)), ir.Constant(K.I32, 1))
        ai = _signed_chunk_dot(b, blk, ai, _gather(b, table, b.or_(lo, hi), range(8)), signs, c, ls)
    return K._fma_acc(b, acc, ai, _scale(b, blk, _S_D)), extra


#: type name -> (block bytes, elements per block, activation sums per block, emitter), as ir.ROW_SPECS
SPECS = {
    "TQ1_0": (_TQ1_TS, 256, 16, _emit_tq1_0),
    "TQ2_0": (_TQ2_TS, 256, 16, _emit_tq2_0),
    "MXFP4": (_MX_TS, 32, 1, _emit_mxfp4),
    "IQ3_XXS": (_XXS_TS, 256, 16, _emit_iq3_xxs),
    "IQ3_S": (_S_TS, 256, 16, _emit_iq3_s),
}
K.ROW_SPECS.update(SPECS)

#: types whose fast row dot is the numba one above (vecdot.KERNEL_TRAITS uses it as it is)
NUMBA_DOTS = {"Q1_0": rowdot_q1_0}

