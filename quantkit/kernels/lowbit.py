"""Row dots for TQ1_0, TQ2_0, MXFP4, Q1_0, IQ3_XXS and IQ3_S weights, as ggml-cpu's ``vec_dot_X_Y``.

LLVM-IR, as ir_rowdot.py's row dots: one weight row's bytes against one token's planar activations of the type's
vec_dot type (activations.py: ``xq`` int8 quants, ``xd`` float32 block scales, ``xs`` int32 group sums).
Integer sums per block (exact), then a float multiply-add per block (per lane of 8) in ggml's terms:

* TQ1_0 / TQ2_0 . Q8_K (``ggml_vec_dot_tq1_0_q8_K``, ``_tq2_0_q8_K``): ``sum((t - 1) * q)``, computed as
  ``sum(t * q) - sum(q)`` with ``sum(q)`` from the activation's bsums; times ``d_w * d_a``;
* MXFP4 . Q8_0 (``ggml_vec_dot_mxfp4_q8_0``): ``(d_a * 2^(e-128)) * sum(E[i] * q)``;
* Q1_0 . Q8_0 (``ggml_vec_dot_q1_0_q8_0``): per 32 values ``sum(+-q) = 2 * sum(bit * q) - sum(q)``, times
  ``d_w * d_a`` of those 32;
* IQ3_XXS / IQ3_S . Q8_K (``ggml_vec_dot_iq3_xxs_q8_K``, ``_iq3_s_q8_K``): signed grid values times
  the quants, times the odd sub-block scale ``2s + 1`` as integers, times ``d_w * d_a``; IQ3_XXS's
  total times 0.25.

Only the per-lane float products round, so a row dot equals the float64 dot of the dequantized operands to
float32 rounding (tests/test_kernels_lowbit.py).

The ``_emit_X`` are per-block emitters for ir_rowdot.py's whole-row loop (u8 x s8 chunks through
``vpdpbusd``), named by each type's row-dot entry in kernels/cpu_traits.py:

* TQ2_0 reuses Q2_K's 2-bit chunk loader (the same ``qs`` layout), TQ1_0 decodes trits with byte
  multiplies and two compares (the top digit of ``b * 3**n mod 256``, ``_top_trit``), both subtract
  ``sum(q)`` from the bsums; on AVX2 their eight chunk products add up as int16 (``ir._dot_small``);
* MXFP4 looks its nibbles up in ``E + 128`` (``vpshufb``) and subtracts ``128 * sum(q)``;
* IQ3_XXS / IQ3_S load eight 4-byte grid points per 32 values from a constant table (as ggml's AVX2
  dot does with ``_mm256_set_epi32``), apply the signs to the activations and scale each 32-chunk by
  ``2s + 1`` (``vpmaddubsw`` + ``vpdpwssd``).

Q1_0 (128 values per block against four Q8_0 scales) does not fit that one-activation-scale-per-block
loop: ``row_q1_0`` is its own IR row loop (each 32-bit mask -> 0/2 bytes, one ``vpdpbusd`` per 32 values
started from ``-sum(q)``), its row-dot entry in kernels/cpu_traits.py. On the integer GEMM it is ``2 * bit``
offset by 1, each 128-value block four of the GEMM's 32-value blocks sharing its ``d`` (gemm.Spec's ``per``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.jit import byte_ptr
from quantkit.kernels import ir as K
from quantkit.kernels import ir_rowdot
from quantkit.quants.common import block_layout
from quantkit.quants.iq3 import GRID_IQ3_S, GRID_IQ3_XXS
from quantkit.quants.mxfp4 import KVALUES_MXFP4

_, _TQ1_QS, _TQ1_QH, _TQ1_D = block_layout("TQ1_0", "qs", "qh", "d")
_, _TQ2_QS, _TQ2_D = block_layout("TQ2_0", "qs", "d")
_, _MX_E, _MX_QS = block_layout("MXFP4", "e", "qs")
_Q1_TS, _Q1_D, _Q1_QS = block_layout("Q1_0", "d", "qs")
_, _XXS_D, _XXS_QS = block_layout("IQ3_XXS", "d", "qs")
_XXS_SAS = _XXS_QS + 64  # IQ3_XXS: the uint32 signs-and-scale words, the last 32 bytes of qs
_, _S_D, _S_QS, _S_QH, _S_SIGNS, _S_SCALES = block_layout("IQ3_S", "d", "qs", "qh", "signs", "scales")


# -- LLVM-IR block emitters for ir_rowdot.py's row loop ---------------------------------------------
# Each: (blk, acc <8 x float>, extra float) -> (acc, extra), as ir_rowdot.py's own emitters.



def _scale(b, blk, off):
    """d_w (fp16 at ``off``) * d_a, the block's float scale."""
    return b.fmul(K._f16(b, blk.wb, off), blk.dx, flags=K._FM)


def _minus_bsums(b, blk, ai):
    """ai - sum of the block's 16 activation bsums (spread over the lanes; only the lane total counts)."""
    return b.sub(ai, K._fold16(b, blk.bsums()))


def _emit_tq2_0(blk, acc, extra):
    b = blk.b
    qs = K._gep(b, blk.wb, _TQ2_QS)  # chunk c: elements 128 * (c // 4) + 32 * (c % 4) + m, Q2_K's qs layout
    ai = K._dot_small(b, blk.v, [(ir_rowdot._chunk_q2_k(b, blk.v, qs, c), K._ld(b, blk.xb, 32 * c, K.V32I8))
                                 for c in range(8)])
    return K._fma_acc(b, acc, _minus_bsums(b, blk, ai), _scale(b, blk, _TQ2_D)), extra


def _pow3(b, v, k):
    """``v * 3**k mod 256`` of bytes ``v`` (<n x i8>)."""
    return b.mul(v, K._vconst([3 ** k] * v.type.count, K.I8)) if k else v


def _top_trit(b, s):
    """The top base-3 digit of bytes q, ggml's ``((uint16_t) q * 3) >> 8`` (0 up to 85, 1 up to 170, else
    2), given as ``s = q ^ 0x80`` (<n x i8>): two signed byte compares (x86 has no unsigned one)."""
    ty = s.type
    n = ty.count
    gt = [b.sext(b.icmp_signed(">", s, K._vconst([lim - 128] * n, K.I8)), ty) for lim in (85, 170)]
    return b.sub(b.sub(ir.Constant(ty, None), gt[0]), gt[1])


def _chunk_tq1_0(b, var, p, c):
    """The trits (0..2) of elements 32c..32c+31 of the TQ1_0 block whose ``qs`` starts at ``p``: qs[0:32]
    holds elements 32n + m (n < 5), qs[32:48] elements 160 + 16n + m, qh[4] elements 240 + 4n + j; trit n
    of a byte is the top digit of byte * 3**n mod 256. The bytes are flipped to q ^ 0x80 first, which
    multiplying by 3**n keeps (an odd factor times 128 is 128 mod 256), for ``_top_trit``'s compares."""
    def ld(off, ty):
        v = K._ld(b, p, off, ty)
        return b.xor(v, K._vconst([0x80] * ty.count, K.I8))

    if c < 5:
        return _top_trit(b, _pow3(b, ld(0, K.V32I8), c))
    v = _pow3(b, ld(32, K.V16I8), 2 * (c - 5))
    if c < 7:
        return _top_trit(b, K._concat16(b, v, _pow3(b, v, 1)))
    qh = ld(_TQ1_QH - _TQ1_QS, ir.VectorType(K.I8, 4))
    qh16 = b.mul(b.shuffle_vector(qh, qh, K._vconst([0, 1, 2, 3] * 4)),
                 K._vconst([1] * 4 + [3] * 4 + [9] * 4 + [27] * 4, K.I8))
    return _top_trit(b, K._concat16(b, v, qh16))


def _emit_tq1_0(blk, acc, extra):
    b = blk.b
    qs = K._gep(b, blk.wb, _TQ1_QS)
    ai = K._dot_small(b, blk.v, [(_chunk_tq1_0(b, blk.v, qs, c), K._ld(b, blk.xb, 32 * c, K.V32I8)) for c in range(8)])
    return K._fma_acc(b, acc, _minus_bsums(b, blk, ai), _scale(b, blk, _TQ1_D)), extra


def _tq_scales(d_off):
    """The GEMM's (scales, mins, d, m) of a TQ type: its 256 values as 8 groups of 32 of integer scale 1
    (the GEMM's group path), the fp16 d at ``d_off``; the offset of 1 (t - 1) is the Spec's."""
    def sc(b, wb):
        return ir.Constant(K.V8I32, [1] * 8), None, K._f16(b, wb, d_off), None
    return sc


_tq1_scales, _tq2_scales = _tq_scales(_TQ1_D), _tq_scales(_TQ2_D)


_MXFP4_U = tuple((int(v) + 128) & 0xFF for v in KVALUES_MXFP4)  # offset by 128 -> unsigned


def _e8m0_half(b, wb):
    """The block's scale byte as float32 (``ir._e8m0_half``)."""
    return K._e8m0_half(b, b.zext(K._ld(b, wb, _MX_E, K.I8), K.I32))


def _chunk_mxfp4(b, var, p, k):  # qs[16] of table indices, looked up offset by 128
    return K._lut16(b, var, K._nibbles16(b, p, 0), _MXFP4_U)


def _mxfp4_scales(b, wb):  # the GEMM's (scales, mins, d, m): one scale per 32-block
    return None, None, _e8m0_half(b, wb), None


def _emit_mxfp4(blk, acc, extra):
    b = blk.b
    scale = b.fmul(blk.dx, _e8m0_half(b, blk.wb), flags=K._FM)  # d_a * GGML_E8M0_TO_FP32_HALF(e)
    xsum = K._ld(b, blk.sb, 0, K.I32)
    neg = b.sub(ir.Constant(K.I32, 0), b.shl(xsum, ir.Constant(K.I32, 7)))
    init = b.insert_element(ir.Constant(K.V8I32, None), neg, ir.Constant(K.I32, 0))
    u = _chunk_mxfp4(b, blk.v, K._gep(b, blk.wb, _MX_QS), 0)
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


def _gather(b, table, idx):
    """<n x word> of table[i] for the n scalar integer indices ``idx``: scalar loads (measured 20 % faster
    per core than AVX2's ``vpgatherdd`` for IQ3_XXS on the Zen 5 test machine, as ggml's AVX2 dots also do
    with ``_mm256_set_epi32`` / ``_mm256_set_epi64x``)."""
    out = ir.Constant(ir.VectorType(table.type.pointee.element, len(idx)), None)
    zero = ir.Constant(K.I32, 0)
    for n, j in enumerate(idx):
        out = b.insert_element(out, b.load(b.gep(table, [zero, j])), ir.Constant(K.I32, n))
    return out


def _pdep(b, x, mask):
    """Deposit the low bits of integer ``x`` into the set bits of the constant 64-bit ``mask`` (BMI2's
    ``pdep``, as ggml's IQ1 dots pack four grid indices; elsewhere one shift-and per run of mask bits)."""
    x = b.zext(x, K.I64) if x.type.width < 64 else x
    if K.HAS_BMI2:
        fn = K._decl(b.module, "llvm.x86.bmi.pdep.64", K.I64, [K.I64, K.I64])
        return b.call(fn, [x, ir.Constant(K.I64, mask)])
    out, src, pos = None, 0, 0
    while mask >> pos:
        if not (mask >> pos) & 1:
            pos += 1
            continue
        n = 0
        while (mask >> (pos + n)) & 1:
            n += 1
        t = b.and_(b.lshr(x, ir.Constant(K.I64, src)) if src else x, ir.Constant(K.I64, (1 << n) - 1))
        t = b.shl(t, ir.Constant(K.I64, pos)) if pos else t
        out = t if out is None else b.or_(out, t)
        src, pos = src + n, pos + n
    return out


def _fields(b, word, bits, n, keep=None):
    """The n ``bits``-wide fields of the integer ``word`` (low first), each masked to ``keep`` bits (default
    all) -> n i64 indices. Extracting grid indices in scalar registers: from a vector they took a
    ``vpextrd`` each, the bottleneck of the lattice dots (IQ2_S 0.87 -> 1.15x ggml per core)."""
    word = b.zext(word, K.I64) if word.type.width < 64 else word
    m = ir.Constant(K.I64, (1 << (keep or bits)) - 1)
    return [b.and_(b.lshr(word, ir.Constant(K.I64, bits * i)) if i else word, m) for i in range(n)]


def _signed_chunk_dot(b, blk, acc, grid_words, signs32, c, ls):
    """acc + ls * (chunk c's unsigned weight bytes ``grid_words`` (any 32-byte vector) . activations),
    bit j of ``signs32`` (or None) negating activation j. ``ls``: one i32 scale for the 32 values, or a
    pair (first 16, last 16). vnni: ``vpmaddubsw`` then ``vpdpwssd`` with the scales (weights < 64, so
    the pairs fit int16), as ir_rowdot.py's ``_scaled_chunks``; elsewhere a u8 x s8 dot times the scales."""
    x = K._ld(b, blk.xb, 32 * c, K.V32I8)
    if signs32 is not None:
        neg = b.bitcast(signs32, ir.VectorType(ir.IntType(1), 32))
        x = b.select(neg, b.sub(ir.Constant(K.V32I8, None), x), x)
    u = b.bitcast(grid_words, K.V32I8)
    lo, hi = ls if isinstance(ls, tuple) else (ls, ls)
    if blk.v in ("vnni", "avx2"):
        lv = b.insert_element(ir.Constant(K.V16I16, None), b.trunc(lo, K.I16), ir.Constant(K.I32, 0))
        lv = b.insert_element(lv, b.trunc(hi, K.I16), ir.Constant(K.I32, 1))
        lv = b.shuffle_vector(lv, lv, K._vconst([0] * 8 + [1] * 8))
        return K._madd_acc(b, blk.v, acc, K._maddubs(b, u, x), lv)
    t = K._dot(b, blk.v, None, u, x, wide=False)
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


def _xxs_scales(b, aux):
    """IQ3_XXS's eight odd sub-block scales 2s + 1, s the top 4 bits of each word of ``aux`` (<8 x i32>)."""
    return b.add(b.shl(b.lshr(aux, K._vconst([28] * 8)), K._vconst([1] * 8)), K._vconst([1] * 8))


def _iq3s_indices(b, wb, c):
    """IQ3_S chunk c's eight 9-bit grid indices: four per 16-bit field, the qs byte | its qh bit << 8."""
    qh = K._ld(b, wb, _S_QH + c, K.I8)
    idx = []
    for h in range(2):
        lo = _pdep(b, K._ld(b, wb, _S_QS + 8 * c + 4 * h, K.I32), 0x00FF00FF00FF00FF)
        hi = _pdep(b, b.lshr(qh, ir.Constant(K.I8, 4 * h)) if h else qh, 0x0100010001000100)
        idx += _fields(b, b.or_(lo, hi), 16, 4)
    return idx


def _emit_iq3_xxs(blk, acc, extra):
    b = blk.b
    table = _grid_table(b, "quantkit_iq3xxs_grid", GRID_IQ3_XXS)
    ai = ir.Constant(K.V8I32, None)
    aux = K._ld(b, blk.wb, _XXS_SAS, K.V8I32)  # the eight sub-blocks' words, decoded in one go
    masks = _xxs_signs(b, aux)
    lss = _xxs_scales(b, aux)
    for c in range(8):
        idx = _fields(b, K._ld(b, blk.wb, _XXS_QS + 8 * c, K.I64), 8, 8)
        mask = b.extract_element(masks, ir.Constant(K.I32, c))
        ls = b.extract_element(lss, ir.Constant(K.I32, c))
        ai = _signed_chunk_dot(b, blk, ai, _gather(b, table, idx), mask, c, ls)
    scale = b.fmul(_scale(b, blk, _XXS_D), ir.Constant(K.F32T, 0.25), flags=K._FM)
    return K._fma_acc(b, acc, ai, scale), extra


def _emit_iq3_s(blk, acc, extra):
    b = blk.b
    table = _grid_table(b, "quantkit_iq3s_grid", GRID_IQ3_S)
    ai = ir.Constant(K.V8I32, None)
    for c in range(8):
        idx = _iq3s_indices(b, blk.wb, c)
        signs = K._ld(b, blk.wb, _S_SIGNS + 4 * c, K.I32)
        sc = b.zext(K._ld(b, blk.wb, _S_SCALES + c // 2, K.I8), K.I32)
        s4 = b.and_(b.lshr(sc, ir.Constant(K.I32, 4 * (c % 2))), ir.Constant(K.I32, 15))
        ls = b.add(b.shl(s4, ir.Constant(K.I32, 1)), ir.Constant(K.I32, 1))
        ai = _signed_chunk_dot(b, blk, ai, _gather(b, table, idx), signs, c, ls)
    return K._fma_acc(b, acc, ai, _scale(b, blk, _S_D)), extra


# -- IQ3_XXS / IQ3_S on the integer GEMM (kernels/gemm.py) -------------------------------------------
# The GEMM wants each 32-value chunk as unsigned bytes u with a fixed offset (u - offset = the value):
# the grid points with their signs applied to them (not to the activations, as the row dots do), plus
# 64 (the grid bytes are below 64, so u stays below 128: no sign trick on avx2); the odd sub-block scale
# 2s + 1 is the group's integer scale, IQ3_XXS's 0.25 folded into d (a power of two: exact).

def _signed_u(b, words, signs32):
    """The 32 grid bytes of ``words`` negated where bit j of ``signs32`` is set, plus 64 -> <32 x i8>."""
    u = b.bitcast(words, K.V32I8)
    neg = b.bitcast(signs32, ir.VectorType(ir.IntType(1), 32))
    return b.add(b.select(neg, b.sub(ir.Constant(K.V32I8, None), u), u), K._splat(K.I8, 32, 64))


def _chunk_iq3_xxs(b, var, p, c):  # p: the block (its d at 0)
    table = _grid_table(b, "quantkit_iq3xxs_grid", GRID_IQ3_XXS)
    idx = _fields(b, K._ld(b, p, _XXS_QS + 8 * c, K.I64), 8, 8)
    mask = b.extract_element(_xxs_signs(b, K._ld(b, p, _XXS_SAS, K.V8I32)), ir.Constant(K.I32, c))
    return _signed_u(b, _gather(b, table, idx), mask)


def _iq3xxs_scales(b, wb):
    return _xxs_scales(b, K._ld(b, wb, _XXS_SAS, K.V8I32)), None, b.fmul(K._f16(b, wb, _XXS_D), ir.Constant(K.F32T, 0.25)), None


def _chunk_iq3_s(b, var, p, c):  # p: the block (its d at 0)
    table = _grid_table(b, "quantkit_iq3s_grid", GRID_IQ3_S)
    return _signed_u(b, _gather(b, table, _iq3s_indices(b, p, c)), K._ld(b, p, _S_SIGNS + 4 * c, K.I32))


def _iq3s_scales(b, wb):
    w = K._ld(b, wb, _S_SCALES, K.I32)
    v = b.shuffle_vector(b.insert_element(ir.Constant(K.V8I32, None), w, ir.Constant(K.I32, 0)),
                         ir.Constant(K.V8I32, None), K._vconst([0] * 8))
    s4 = b.and_(b.lshr(v, K._vconst([4 * c for c in range(8)])), K._vconst([15] * 8))
    return b.add(b.shl(s4, K._vconst([1] * 8)), K._vconst([1] * 8)), None, K._f16(b, wb, _S_D), None


# -- Q1_0: its own row loop; on the GEMM 2 * bit per value, offset 1, four Q8_0 blocks per d -----------

def _chunk_q1_0(b, var, p, c):  # p: the block's qs
    return K._bits_to_bytes(b, K._ld(b, p, 4 * c, K.I32), 1)


def _q1_scales(b, wb):
    return None, None, K._f16(b, wb, _Q1_D), None


def row_q1_0(variant):
    """The intrinsic ``ROW(wr, xq, xd, xs) -> float32`` of Q1_0 against Q8_0 activations (``xd``, ``xs``:
    one scale and one sum per 32) for an IR variant."""

    def impl(typingctx, wr, xq, xd, xs):
        sig = types.float32(wr, xq, xd, xs)

        def codegen(context, builder, signature, args):
            b, ta = builder, signature.args
            zero = context.get_constant(types.intp, 0)
            wp, xp, dp, sp = (byte_ptr(context, b, ta[i], args[i], zero, types.intp) for i in range(4))
            dp = b.bitcast(dp, K.F32T.as_pointer())
            sp = b.bitcast(sp, K.I32.as_pointer())
            nd = cgutils.unpack_tuple(b, context.make_array(ta[2])(context, b, args[2]).shape)[0]
            nb = b.sdiv(nd, ir.Constant(nd.type, 4))
            accps = [cgutils.alloca_once_value(b, ir.Constant(K.V8F32, None)) for _ in range(2)]
            with cgutils.for_range(b, nb) as loop:
                i = loop.index
                wb = b.gep(wp, [b.mul(i, ir.Constant(i.type, _Q1_TS))])
                if K.PREFETCH:
                    pf = K._decl(b.module, "llvm.prefetch.p0", ir.VoidType(), [K.I8.as_pointer(), K.I32, K.I32, K.I32])
                    b.call(pf, [K._gep(b, wb, K.PREFETCH), ir.Constant(K.I32, 0), ir.Constant(K.I32, 3),
                                ir.Constant(K.I32, 1)])
                dw = K._f16(b, wb, _Q1_D)
                for k in range(4):
                    j = b.add(b.mul(i, ir.Constant(i.type, 4)), ir.Constant(i.type, k))
                    u = K._bits_to_bytes(b, K._ld(b, wb, _Q1_QS + 4 * k, K.I32), 1)  # 2 * bit
                    neg = b.sub(ir.Constant(K.I32, 0), b.load(b.gep(sp, [j])))
                    init = b.insert_element(ir.Constant(K.V8I32, None), neg, ir.Constant(K.I32, 0))
                    x = b.load(b.bitcast(b.gep(xp, [b.mul(j, ir.Constant(j.type, 32))]), K.V32I8.as_pointer()), align=1)
                    t = K._dot(b, variant, init, u, x, wide=False)
                    acc = K._fma_acc(b, b.load(accps[k % 2]), t, b.fmul(dw, b.load(b.gep(dp, [j])), flags=K._FM))
                    b.store(acc, accps[k % 2])
            acc = b.fadd(b.load(accps[0]), b.load(accps[1]), flags=K._FM)
            for n in (4, 2, 1):
                acc = b.fadd(K._shuf(b, acc, range(n)), K._shuf(b, acc, range(n, 2 * n)), flags=K._FM)
            return b.extract_element(acc, ir.Constant(K.I32, 0))

        return sig, codegen

    impl.__name__ = f"row_q1_0_{variant}"
    return intrinsic(impl)

