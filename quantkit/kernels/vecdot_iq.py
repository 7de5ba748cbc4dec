"""Row dots of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) against Q8_K activations.

Per-block LLVM-IR emitters for ir_rowdot.py's whole-row loop (named by each type's row-dot entry in kernels/cpu_traits.py; the row
dots, their 2-row forms and the GEMVs are built from them as for every other quantized type). Each
follows ggml's ``ggml_vec_dot_X_q8_K`` (ggml-cpu/arch/x86/quants.c): per super-block one integer sum of
grid value * sign * activation, weighted by the small odd block scales ``2s + 1``, then one float
multiply-add with ``fp16(d) * y.d`` (times 1/8).

* A group of 8 weights is one 64-bit word of a constant grid table (quants/grids.py, the grids gguf-py
  and ggml share); a 32-value chunk is four scalar loads, as ggml's AVX2 dots do with
  ``_mm256_set_epi64x``, their indices computed in scalar registers (lowbit.py's ``_pdep`` / ``_fields``:
  four to an i64, as ggml's IQ1 dots with BMI2; from a vector they took a ``vpextrd`` each, the
  bottleneck). The grid values are positive (IQ2: 8..43), so a chunk is ``vpmaddubsw`` with
  the activations -- their signs flipped by the weights' sign mask (``_mm256_sign_epi8`` in ggml) --
  then ``vpdpwssd`` with the scales (lowbit.py's ``_signed_chunk_dot``).
* Signs: IQ2_XXS / IQ2_XS store 7 bits per group and the 8th is their parity (``ksigns_iq2xs``),
  computed here with shift-xors; IQ2_S stores the 8 bits.
* IQ1_S / IQ1_M: grid values g in {-1, 0, 1} and a shift ``delta = +-1/8`` per 32 (IQ1_S) or per group
  of 8 (IQ1_M). The delta's sign bit is a 12th index bit into a 4096-word table of the unsigned
  ``u = 8 g + sign(delta) + 16`` (32 KiB; IQ1_M 0.77 -> 0.89x ggml per core against adding the delta's
  bytes per chunk), so one u8 x s8 chunk dot yields ``8 sum(g q) + sum(sign(delta) q) + 16 sum(q)``, the
  last removed through the activations' ``bsums``: ggml's ``sumi + 1/8 * sumi1`` times 8, all in
  integers; the float scale carries the 1/8.

Exact in the integer parts like ggml's; only the per-lane float products round, so a row dot equals the
float64 dot of the dequantized operands to float32 rounding (tests/test_vecdot_iq.py).

The same index, sign and scale decoders feed the integer GEMM's chunk loaders (the ``_chunk_X`` /
``_X_scales`` pairs at the end, the types' GEMM entries in kernels/cpu_traits.py): there the signs are
applied to the grid bytes, not to the activations (tests/test_gemm.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba.core import cgutils

from quantkit.kernels import ir as K
from quantkit.kernels.lowbit import _fields, _gather, _grid_table, _pdep, _scale, _signed_chunk_dot, _signed_u, _xxs_signs
from quantkit.quants.common import block_layout
from quantkit.quants.grids import grid_values

_, _XXS_D, _XXS_QS = block_layout("IQ2_XXS", "d", "qs")
_, _XS_D, _XS_QS, _XS_SC = block_layout("IQ2_XS", "d", "qs", "scales")
_, _S_D, _S_QS, _S_QH, _S_SC = block_layout("IQ2_S", "d", "qs", "qh", "scales")
_, _1S_D, _1S_QS, _1S_QH = block_layout("IQ1_S", "d", "qs", "qh")
_, _1M_QS, _1M_QH, _1M_SC = block_layout("IQ1_M", "qs", "qh", "scales")

_V8I8 = ir.VectorType(K.I8, 8)
_V16I32 = ir.VectorType(K.I32, 16)
_V32I16 = ir.VectorType(K.I16, 32)
#: IQ1's table of 4096 words: index bit 11 the delta's sign (set: -1), bits 0..10 the grid point; each
#: grid value g stored as ``8 g + sign(delta) + 16`` (in 7..25)
_G1_DELTA = np.concatenate([8 * grid_values(T.IQ1_S) + 17, 8 * grid_values(T.IQ1_S) + 15])


def _c(v, n=8, ty=K.I32):
    return K._vconst([v] * n, ty)


def _chunks(b, blk, table, idx, signs, scales):
    """Sum over the 8 chunks of a super-block: chunk c's four grid words (``idx(c)``: four scalar indices),
    its sign mask (i32 element c of ``signs`` <8 x i32>, or None), its scales (``scales(c)``: an i32 or a
    pair per 16). -> <8 x i32>; two accumulator chains (the vpdpwssd latency)."""
    accs = [ir.Constant(K.V8I32, None)] * 2
    for c in range(8):
        u = b.bitcast(_gather(b, table, idx(c)), K.V32I8)
        s = None if signs is None else b.extract_element(signs, ir.Constant(K.I32, c))
        accs[c % 2] = _signed_chunk_dot(b, blk, accs[c % 2], u, s, c, scales(c))
    return b.add(accs[0], accs[1])


def _lane(b, v, i):
    return b.extract_element(v, ir.Constant(K.I32, i))


def _nibble_ls(b, wb, off):
    """IQ2_XS / IQ2_S: 8 bytes of two 4-bit scales -> the 16 odd scales 2s + 1 (<16 x i32>, per 16 values:
    byte c's low nibble, then its high one)."""
    s = b.zext(K._ld(b, wb, off, _V8I8), K.V8I32)
    s16 = K._shuf(b, s, [j // 2 for j in range(16)])
    s4 = b.and_(b.lshr(s16, K._vconst([4 * (j % 2) for j in range(16)])), _c(15, 16))
    return b.add(b.shl(s4, _c(1, 16)), _c(1, 16))


def _pairs(b, ls16):
    """``scales(c)`` of ``_chunks`` from 16 per-16 scales: the pair of chunk c."""
    return lambda c: (_lane(b, ls16, 2 * c), _lane(b, ls16, 2 * c + 1))


def _finish(blk, acc, ai, d_off):
    """acc + float(ai) * fp16(d) * y.d / 8."""
    b = blk.b
    scale = b.fmul(_scale(b, blk, d_off), ir.Constant(K.F32T, 0.125), flags=K._FM)
    return K._fma_acc(b, acc, ai, scale)


def _d8(b, wb, off):
    """fp16(d) / 8 of a lattice block (the GEMM's float scale; a power of two: exact)."""
    return b.fmul(K._f16(b, wb, off), ir.Constant(K.F32T, 0.125))


def _iq2xxs_aux(b, wb):
    """IQ2_XXS's eight sign-and-scale words (the odd uint32 of qs)."""
    return K._shuf(b, K._ld(b, wb, _XXS_QS, _V16I32), range(1, 16, 2))


def _iq2xxs_idx(b, wb, c):
    return _fields(b, K._ld(b, wb, _XXS_QS + 8 * c, K.I32), 8, 4)


def _iq2xxs_ls(b, aux):
    return b.add(b.shl(b.lshr(aux, _c(28)), _c(1)), _c(1))


def _emit_iq2_xxs(blk, acc, extra):
    """Per 32: four grid indices (bytes 0..3), then a word of four 7-bit sign groups and the scale
    (bits 28..31), as IQ3_XXS's."""
    b = blk.b
    table = _grid_table(b, "quantkit_iq2xxs_grid", grid_values(T.IQ2_XXS))
    aux = _iq2xxs_aux(b, blk.wb)
    lss = _iq2xxs_ls(b, aux)
    ai = _chunks(b, blk, table, lambda c: _iq2xxs_idx(b, blk.wb, c), _xxs_signs(b, aux), lambda c: _lane(b, lss, c))
    return _finish(blk, acc, ai, _XXS_D), extra


def _iq2xs_signs(b, v):
    """IQ2_XS's uint16 words ``v`` (<n x i16>) -> their n sign bytes: the 7 bits above the 9-bit index,
    the 8th their parity."""
    n = v.type.count
    s7 = b.lshr(v, _c(9, n, K.I16))
    p = s7
    for sh in (4, 2, 1):  # parity of the 7 bits into bit 0
        p = b.xor(p, b.lshr(p, _c(sh, n, K.I16)))
    return b.trunc(b.or_(s7, b.shl(b.and_(p, _c(1, n, K.I16)), _c(7, n, K.I16))), ir.VectorType(K.I8, n))


def _iq2xs_idx(b, wb, c):
    return _fields(b, K._ld(b, wb, _XS_QS + 8 * c, K.I64), 16, 4, keep=9)


def _emit_iq2_xs(blk, acc, extra):
    """Per group of 8: one uint16, a 9-bit grid index and a 7-bit sign group (8th bit: the parity)."""
    b = blk.b
    table = _grid_table(b, "quantkit_iq2xs_grid", grid_values(T.IQ2_XS))
    signs = b.bitcast(_iq2xs_signs(b, K._ld(b, blk.wb, _XS_QS, _V32I16)), K.V8I32)
    ai = _chunks(b, blk, table, lambda c: _iq2xs_idx(b, blk.wb, c), signs, _pairs(b, _nibble_ls(b, blk.wb, _XS_SC)))
    return _finish(blk, acc, ai, _XS_D), extra


def _iq2s_idx(b, wb, c):
    """IQ2_S chunk c's four grid indices: qs[g] | 2 bits of qh[c] << 8."""
    lo = _pdep(b, K._ld(b, wb, _S_QS + 4 * c, K.I32), 0x00FF00FF00FF00FF)
    hi = _pdep(b, K._ld(b, wb, _S_QH + c, K.I8), 0x0300030003000300)
    return _fields(b, b.or_(lo, hi), 16, 4)


def _emit_iq2_s(blk, acc, extra):
    """Per group g of 8: grid index qs[g] | 2 bits of qh[g / 4] << 8, the 8 sign bits in qs[32 + g]."""
    b = blk.b
    table = _grid_table(b, "quantkit_iq2s_grid", grid_values(T.IQ2_S))
    signs = K._ld(b, blk.wb, _S_QS + 32, K.V8I32)
    ai = _chunks(b, blk, table, lambda c: _iq2s_idx(b, blk.wb, c), signs, _pairs(b, _nibble_ls(b, blk.wb, _S_SC)))
    return _finish(blk, acc, ai, _S_D), extra


def _minus_16_sums(b, blk, ai, ls16):
    """ai - 16 * sum over the 16-sums of the activations times their scales (<16 x i32>)."""
    return b.sub(ai, b.shl(K._fold16(b, b.mul(ls16, blk.bsums())), _c(4)))


def _iq1s_idx(b, wb, c):
    """IQ1_S chunk c's four indices into ``_G1_DELTA``: the qs byte, 3 bits of the uint16 qh[c] per group,
    its bit 15 (the delta's sign) as bit 11."""
    qh = K._ld(b, wb, _1S_QH + 2 * c, K.I16)
    lo = _pdep(b, K._ld(b, wb, _1S_QS + 4 * c, K.I32), 0x00FF00FF00FF00FF)
    hi = _pdep(b, qh, 0x0700070007000700)  # 3 bits per group
    neg = b.ashr(b.sext(qh, K.I64), ir.Constant(K.I64, 15))  # all ones where the delta is negative
    delta = b.and_(neg, ir.Constant(K.I64, 0x0800080008000800))
    return _fields(b, b.or_(b.or_(lo, hi), delta), 16, 4)


def _iq1s_ls(b, wb):
    """IQ1_S's eight odd scales 2s + 1 (qh bits 12..14), <8 x i32>."""
    qh = b.zext(K._ld(b, wb, _1S_QH, ir.VectorType(K.I16, 8)), K.V8I32)
    return b.add(b.shl(b.and_(b.lshr(qh, _c(12)), _c(7)), _c(1)), _c(1))


def _emit_iq1_s(blk, acc, extra):
    """Per 32: four grid index bytes, and a uint16 qh: 3 index bits per group, the scale (bits 12..14),
    the delta's sign (bit 15)."""
    b = blk.b
    table = _grid_table(b, "quantkit_iq1_grid_delta", _G1_DELTA)
    ls = _iq1s_ls(b, blk.wb)
    ai = _chunks(b, blk, table, lambda c: _iq1s_idx(b, blk.wb, c), None, lambda c: _lane(b, ls, c))
    ai = _minus_16_sums(b, blk, ai, K._shuf(b, ls, [g // 2 for g in range(16)]))
    return _finish(blk, acc, ai, _1S_D), extra


def _iq1m_d(b, sc):
    """IQ1_M's fp16 super-block scale from the top nibbles of its four scale words (<4 x i32>)."""
    u = None
    for k in range(4):
        t = b.shl(b.lshr(_lane(b, sc, k), ir.Constant(K.I32, 12)), ir.Constant(K.I32, 4 * k))
        u = t if u is None else b.or_(u, t)
    h = b.bitcast(b.trunc(u, K.I16), ir.HalfType())
    if K.HAS_F16:
        return b.fpext(h, K.F32T)
    slot = cgutils.alloca_once(b, ir.HalfType())  # ir.py's portable fp16 load
    b.store(h, slot)
    return K._f16(b, b.bitcast(slot, K.I8.as_pointer()), 0)


def _iq1m_idx(b, wb, c):
    """IQ1_M chunk c's four indices into ``_G1_DELTA``: qs[g] | the nibble g % 2 of qh[g / 2] << 8."""
    lo = _pdep(b, K._ld(b, wb, _1M_QS + 4 * c, K.I32), 0x00FF00FF00FF00FF)
    hi = _pdep(b, K._ld(b, wb, _1M_QH + 2 * c, K.I16), 0x0F000F000F000F00)
    return _fields(b, b.or_(lo, hi), 16, 4)


def _iq1m_sc(b, wb):
    """IQ1_M's four scale words (<4 x i32>) and their 16 odd 3-bit scales 2s + 1 (<16 x i32>, per 16)."""
    sc = b.zext(K._ld(b, wb, _1M_SC, ir.VectorType(K.I16, 4)), ir.VectorType(K.I32, 4))
    sc16 = K._shuf(b, sc, [j // 4 for j in range(16)])
    s3 = b.and_(b.lshr(sc16, K._vconst([3 * (j % 4) for j in range(16)])), _c(7, 16))
    return sc, b.add(b.shl(s3, _c(1, 16)), _c(1, 16))


def _emit_iq1_m(blk, acc, extra):
    """Per group g of 8: grid index qs[g] | 3 bits of the nibble g % 2 of qh[g / 2] << 8, the delta's
    sign the nibble's bit 3 (so the nibble is index bits 8..11 of ``_G1_DELTA``); per 16 a 3-bit scale
    in the four scale words (whose top nibbles are d)."""
    b = blk.b
    table = _grid_table(b, "quantkit_iq1_grid_delta", _G1_DELTA)
    sc, ls = _iq1m_sc(b, blk.wb)
    ai = _chunks(b, blk, table, lambda c: _iq1m_idx(b, blk.wb, c), None, _pairs(b, ls))
    ai = _minus_16_sums(b, blk, ai, ls)
    scale = b.fmul(b.fmul(_iq1m_d(b, sc), blk.dx, flags=K._FM), ir.Constant(K.F32T, 0.125), flags=K._FM)
    return K._fma_acc(b, acc, ai, scale), extra


# -- on the integer GEMM (kernels/gemm.py) -----------------------------------------------------------
# As lowbit.py's IQ3 chunks: each 32-value chunk as unsigned bytes u = value + offset. IQ2: the grid
# points (8..43) with their signs applied, plus 64 (lowbit.py's ``_signed_u``; below 128, so no sign
# trick on avx2); IQ1: ``_G1_DELTA``'s ``8 g + sign(delta) + 16`` as stored, offset 16. The odd
# scales 2s + 1 are the integer group scales (per 32: IQ2_XXS, IQ1_S; per 16: IQ2_XS, IQ2_S, IQ1_M),
# the 1/8 is folded into d. The chunk loaders get the block's start (the Spec's field at offset 0).

def _chunk_iq2_xxs(b, var, p, c):
    table = _grid_table(b, "quantkit_iq2xxs_grid", grid_values(T.IQ2_XXS))
    mask = _lane(b, _xxs_signs(b, _iq2xxs_aux(b, p)), c)
    return _signed_u(b, _gather(b, table, _iq2xxs_idx(b, p, c)), mask)


def _iq2xxs_scales(b, wb):
    return _iq2xxs_ls(b, _iq2xxs_aux(b, wb)), None, _d8(b, wb, _XXS_D), None


def _chunk_iq2_xs(b, var, p, c):
    table = _grid_table(b, "quantkit_iq2xs_grid", grid_values(T.IQ2_XS))
    signs = b.bitcast(_iq2xs_signs(b, K._ld(b, p, _XS_QS + 8 * c, ir.VectorType(K.I16, 4))), K.I32)
    return _signed_u(b, _gather(b, table, _iq2xs_idx(b, p, c)), signs)


def _iq2xs_scales(b, wb):
    return _nibble_ls(b, wb, _XS_SC), None, _d8(b, wb, _XS_D), None


def _chunk_iq2_s(b, var, p, c):
    table = _grid_table(b, "quantkit_iq2s_grid", grid_values(T.IQ2_S))
    return _signed_u(b, _gather(b, table, _iq2s_idx(b, p, c)), K._ld(b, p, _S_QS + 32 + 4 * c, K.I32))


def _iq2s_scales(b, wb):
    return _nibble_ls(b, wb, _S_SC), None, _d8(b, wb, _S_D), None


def _chunk_iq1_s(b, var, p, c):
    return b.bitcast(_gather(b, _grid_table(b, "quantkit_iq1_grid_delta", _G1_DELTA), _iq1s_idx(b, p, c)), K.V32I8)


def _iq1s_scales(b, wb):
    return _iq1s_ls(b, wb), None, _d8(b, wb, _1S_D), None


def _chunk_iq1_m(b, var, p, c):
    return b.bitcast(_gather(b, _grid_table(b, "quantkit_iq1_grid_delta", _G1_DELTA), _iq1m_idx(b, p, c)), K.V32I8)


def _iq1m_scales(b, wb):
    sc, ls = _iq1m_sc(b, wb)
    return ls, None, b.fmul(_iq1m_d(b, sc), ir.Constant(K.F32T, 0.125)), None
