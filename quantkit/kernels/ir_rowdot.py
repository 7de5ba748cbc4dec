"""The integer row dots' IR emitters: the weight chunk loaders (also used by the prefill
micro-kernels, ``gemm.py``), the super-block scale decoders and the whole-row dot loops
(``row_dot``). Which emitter a type's row dot uses is its entry in kernels/cpu_traits.py. The shared helpers
and the variants are in ``ir.py``."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit import config
from quantkit.formats.ggml_types import KVALUES_IQ4NL, type_info
from quantkit.kernels.ir import (F32T, act_sums, HAS_VNNI512, I8, I16, I32, I64, PAIRS_512, PREFETCH, V8F32, V8I32, V16I8, V16I16, V32I8,
                                 _FM,
                                 _bits_to_bytes, _byte_ptr, _decl, _dot, _f16, _madd_acc, _maddubs, _fma_acc, _fold16, _gep, _ld, _load, _lut16,
                                 _nibbles16, _pairs16, _shuf, _splat, _vconst)


# -- weight chunk loaders: (builder, variant, p, k) -> <32 x i8> unsigned values of chunk k --------

_IQ4_U = tuple((v + 128) & 0xFF for v in KVALUES_IQ4NL)  # offset by 128 -> unsigned

#: byte offsets inside a block of the fields the super-block emitters read (the type table's); Q5_K's
#: d / dmin / scales sit where Q4_K's do
_F = {n: type_info(n).offsets for n in ("Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ4_XS")}


def _chunk_q8_0(b, var, p, k):  # qs[32] int8 -> q ^ 0x80 = q + 128
    return b.xor(_load(b, p, 0, V32I8), _splat(I8, 32, 0x80))


def _chunk_q4_0(b, var, p, k):  # qs[16]
    return _nibbles16(b, p, 0)


def _chunk_q5_0(b, var, p, k):  # qh[4] then qs[16]; bit j of qh is bit 4 of element j
    qh = _load(b, p, 0, I32)
    return b.or_(_nibbles16(b, p, 4), _bits_to_bytes(b, qh, 4))


def _chunk_iq4_nl(b, var, p, k):  # qs[16] of table indices
    return _lut16(b, var, _nibbles16(b, p, 0), _IQ4_U)


def _chunk_iq4_xs(b, var, p, k):  # qs[128]: 16 bytes per 32-chunk
    return _lut16(b, var, _nibbles16(b, p, 16 * k), _IQ4_U)


def _chunk_q4_k(b, var, p, k):  # qs[128]: 64 elements per 32 bytes, low nibbles first
    v = _load(b, p, 32 * (k // 2), V32I8)
    return b.and_(v, _splat(I8, 32, 15)) if k % 2 == 0 else b.lshr(v, _splat(I8, 32, 4))


def _chunk_q5_k(b, var, p, k):  # qh[32] then qs[128]; chunk k takes bit k of qh
    v = _load(b, p, 32 + 32 * (k // 2), V32I8)
    lo = b.and_(v, _splat(I8, 32, 15)) if k % 2 == 0 else b.lshr(v, _splat(I8, 32, 4))
    h = _load(b, p, 0, V32I8)
    hb = b.and_(b.lshr(h, _splat(I8, 32, k)), _splat(I8, 32, 1)) if k else b.and_(h, _splat(I8, 32, 1))
    return b.or_(lo, b.shl(hb, _splat(I8, 32, 4)))


def _chunk_q6_k(b, var, p, k):  # ql[128] qh[64]; 128 elements per half, 4 chunks each
    n, i = divmod(k, 4)
    ql = _load(b, p, 64 * n + 32 * (i % 2), V32I8)
    lo = b.and_(ql, _splat(I8, 32, 15)) if i < 2 else b.lshr(ql, _splat(I8, 32, 4))
    h = _load(b, p, 128 + 32 * n, V32I8)
    if i:
        h = b.lshr(h, _splat(I8, 32, 2 * i))
    hb = b.and_(h, _splat(I8, 32, 3))
    return b.or_(lo, b.shl(hb, _splat(I8, 32, 4)))


def _chunk_q3_k(b, var, p, k):  # hmask[32] qs[64]; value = low2 + 4*hbit (caller subtracts 4)
    n, j = divmod(k, 4)
    q = _load(b, p, 32 + 32 * n, V32I8)
    if j:
        q = b.lshr(q, _splat(I8, 32, 2 * j))
    low = b.and_(q, _splat(I8, 32, 3))
    h = _load(b, p, 0, V32I8)
    if k:
        h = b.lshr(h, _splat(I8, 32, k))
    hb = b.and_(h, _splat(I8, 32, 1))
    return b.or_(low, b.shl(hb, _splat(I8, 32, 2)))


def _chunk_q2_k(b, var, p, k):  # qs[64]
    n, j = divmod(k, 4)
    q = _load(b, p, 32 * n, V32I8)
    if j:
        q = b.lshr(q, _splat(I8, 32, 2 * j))
    return b.and_(q, _splat(I8, 32, 3))


# -- whole-row dots ----------------------------------------------------------------------------------
#
# ``ROW(wr, xq, xd, xs) -> float32``: one weight row (bytes) . one token's planar activations, as one
# IR loop over the row's blocks. Per block: the integer dots of its 32-element chunks (times the
# sub-block scales, for super-blocks) stay in an <8 x i32>; it is converted once to float and
# multiply-added into an <8 x float> accumulator with the block's float scale; mins / offsets go
# through the activation sums the same way. One horizontal float reduction per row.


#: independent vpdpwssd accumulators per super-block in the 256-bit loop: one chain of eight waits on
#: the instruction's latency (Q2_K / Q3_K 5-10 % faster per core with 4 on the Zen 5 test machine)
NACC = 4
#: the K-quant super-block dots with 512-bit VNNI where the CPU has it (QUANTKIT_K512=0 turns it off)
K512 = config.k512()


def _scaled_chunks(builder, variant, chunk, wq, xb, scv, per, small=True):
    """sum over the 8 chunks of a super-block of (u8 . s8 lanes) * scale lanes -> <8 x i32>.

    ``small``: the unsigned values are < 64, so pairs of u8*s8 fit in int16; with VNNI the chunk is
    then ``vpmaddubsw`` (u8 x s8 -> i16 pairs) + ``vpdpwssd`` (i16 x i16 scale, accumulated in i32):
    two instructions instead of vpdpbusd + vpmulld (two uops) + add, as ggml's AVX2 K-quant dots.
    Where the CPU has 512-bit VNNI (and ``K512``), chunks go two at a time (``_scaled_chunk_pairs``)."""
    if variant == "vnni" and HAS_VNNI512 and K512:
        return _scaled_chunk_pairs(builder, chunk, wq, xb, scv, per, small)
    if variant in ("vnni", "avx2") and small:
        n = 8 if per == 32 else 16
        sc16 = builder.trunc(scv, ir.VectorType(I16, n))
        accs = [ir.Constant(V8I32, None)] * NACC
        for k in range(8):
            p16 = _maddubs(builder, chunk(builder, variant, wq, k), _ld(builder, xb, 32 * k, V32I8))
            mask = [k] * 16 if per == 32 else [2 * k] * 8 + [2 * k + 1] * 8
            s16 = builder.shuffle_vector(sc16, sc16, _vconst(mask))
            accs[k % NACC] = _madd_acc(builder, variant, accs[k % NACC], p16, s16)
        while len(accs) > 1:  # integer sums: the same result in any order
            accs = [builder.add(accs[i], accs[i + 1]) for i in range(0, len(accs), 2)]
        return accs[0]
    acc = ir.Constant(V8I32, None)
    for k in range(8):
        t = _dot(builder, variant, None, chunk(builder, variant, wq, k), _ld(builder, xb, 32 * k, V32I8), wide=not small)
        mask = [k] * 8 if per == 32 else [2 * k] * 4 + [2 * k + 1] * 4
        acc = builder.add(acc, builder.mul(t, _shuf(builder, scv, mask)))
    return acc


def _scaled_chunk_pairs(builder, chunk, wq, xb, scv, per, small):
    """``_scaled_chunks`` with 512-bit instructions: chunks 2j and 2j+1 side by side in one zmm (their
    activations are contiguous: one 64-byte load), half the dot instructions of the 256-bit loop.
    Lanes 0-7 of the 16-lane result hold chunk 2j's lanes, 8-15 chunk 2j+1's; folding lane i + 8 into
    lane i gives exactly the 256-bit loop's integer lanes, so the float results are the same bits."""
    b = builder
    v16i32, v64i8, v32i16 = ir.VectorType(I32, 16), ir.VectorType(I8, 64), ir.VectorType(I16, 32)
    accs = [ir.Constant(v16i32, None)] * 2  # two chains: pairs 0, 2 and 1, 3 (integer sums: exact)
    if small:
        n = 8 if per == 32 else 16
        sc16 = b.trunc(scv, ir.VectorType(I16, n))
        mad = _decl(b.module, "llvm.x86.avx512.pmaddubs.w.512", v32i16, [v64i8, v64i8])
        dpw = _decl(b.module, "llvm.x86.avx512.vpdpwssd.512", v16i32, [v16i32, v16i32, v16i32])
    else:
        dpb = _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", v16i32, [v16i32, v16i32, v16i32])
    for j in range(4):
        k0, k1 = 2 * j, 2 * j + 1
        u = b.shuffle_vector(chunk(b, "vnni", wq, k0), chunk(b, "vnni", wq, k1), _vconst(range(64)))
        x = _ld(b, xb, 64 * j, v64i8)
        if small:
            p16 = b.call(mad, [u, x])
            mask = ([k0] * 16 + [k1] * 16 if per == 32 else
                    [2 * k0] * 8 + [2 * k0 + 1] * 8 + [2 * k1] * 8 + [2 * k1 + 1] * 8)
            s16 = b.shuffle_vector(sc16, sc16, _vconst(mask))
            accs[j % 2] = b.call(dpw, [accs[j % 2], b.bitcast(p16, v16i32), b.bitcast(s16, v16i32)])
        else:
            t = b.call(dpb, [ir.Constant(v16i32, None), b.bitcast(u, v16i32), b.bitcast(x, v16i32)])
            mask = [k0] * 8 + [k1] * 8 if per == 32 else [2 * k0] * 4 + [2 * k0 + 1] * 4 + [2 * k1] * 4 + [2 * k1 + 1] * 4
            accs[j % 2] = b.add(accs[j % 2], b.mul(t, _shuf(b, scv, mask)))
    return _fold16(b, b.add(accs[0], accs[1]))


def _kmask_q4k(builder, wb):
    """Q4_K / Q5_K: the 12 scale bytes at wb+4 -> (scales <8 x i32>, mins <8 x i32>), as ggml's
    utmp / kmask shuffle (== get_scale_min_k4)."""
    u0, u1, u2 = (_ld(builder, wb, _F["Q4_K"]["scales"] + 4 * i, I32) for i in range(3))
    k1, k2, k3 = (ir.Constant(I32, c) for c in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))
    c4, c6 = ir.Constant(I32, 4), ir.Constant(I32, 6)
    m47 = builder.or_(builder.and_(builder.lshr(u2, c4), k2), builder.shl(builder.and_(builder.lshr(u1, c6), k3), c4))
    m03 = builder.and_(u1, k1)
    s47 = builder.or_(builder.and_(u2, k2), builder.shl(builder.and_(builder.lshr(u0, c6), k3), c4))
    s03 = builder.and_(u0, k1)
    v = ir.Constant(ir.VectorType(I32, 4), None)
    for i, x in enumerate((s03, s47, m03, m47)):
        v = builder.insert_element(v, x, ir.Constant(I32, i))
    v16 = builder.zext(builder.bitcast(v, V16I8), ir.VectorType(I32, 16))
    return _shuf(builder, v16, range(8)), _shuf(builder, v16, range(8, 16))


def _q3k_scales(builder, wb):
    """Q3_K: the 12 scale bytes at wb+96 -> 16 signed scales <16 x i32> (6-bit, minus 32)."""
    a0, a1, tmp = (_ld(builder, wb, _F["Q3_K"]["scales"] + 4 * i, I32) for i in range(3))
    k1, k2 = ir.Constant(I32, 0x03030303), ir.Constant(I32, 0x0F0F0F0F)
    c = lambda n: ir.Constant(I32, n)  # noqa: E731
    hi = lambda sh: builder.shl(builder.and_(builder.lshr(tmp, c(sh)) if sh else tmp, k1), c(4))  # noqa: E731
    aux = (builder.or_(builder.and_(a0, k2), hi(0)),
           builder.or_(builder.and_(a1, k2), hi(2)),
           builder.or_(builder.and_(builder.lshr(a0, c(4)), k2), hi(4)),
           builder.or_(builder.and_(builder.lshr(a1, c(4)), k2), hi(6)))
    v = ir.Constant(ir.VectorType(I32, 4), None)
    for i, x in enumerate(aux):
        v = builder.insert_element(v, x, ir.Constant(I32, i))
    v16 = builder.zext(builder.bitcast(v, V16I8), ir.VectorType(I32, 16))
    return builder.sub(v16, _vconst([32] * 16))


def _iq4xs_scales(builder, wb):
    """IQ4_XS: scales_h (u16 at wb+2) and scales_l (4 bytes at wb+4) -> 8 signed scales <8 x i32>."""
    sh = builder.zext(_ld(builder, wb, _F["IQ4_XS"]["scales_h"], I16), I32)
    shv = builder.shuffle_vector(builder.insert_element(ir.Constant(V8I32, None), sh, ir.Constant(I32, 0)),
                                 ir.Constant(V8I32, None), ir.Constant(V8I32, [0] * 8))
    high = builder.shl(builder.and_(builder.lshr(shv, _vconst(range(0, 16, 2))), _vconst([3] * 8)), _vconst([4] * 8))
    sl = _ld(builder, wb, _F["IQ4_XS"]["scales_l"], ir.VectorType(I8, 4))
    sl8 = builder.zext(builder.shuffle_vector(sl, sl, _vconst([0, 0, 1, 1, 2, 2, 3, 3])), V8I32)
    low = builder.and_(builder.lshr(sl8, _vconst([0, 4] * 4)), _vconst([15] * 8))
    return builder.sub(builder.or_(low, high), _vconst([32] * 8))


class _Blk:
    """What a per-block emitter gets: builder, variant, and pointers at this block."""

    def __init__(self, builder, variant, wb, xb, dx, sb):
        self.b, self.v, self.wb, self.xb, self.dx, self.sb = builder, variant, wb, xb, dx, sb

    def bsums(self):
        return _ld(self.b, self.sb, 0, ir.VectorType(I32, 16))


# Each emitter: (blk, acc <8 x float>, extra float) -> (acc, extra); result = reduce(acc) + extra.

def _legacy(ts, q_off, chunk, offset, has_min):
    def emit(k, acc, extra):
        b = k.b
        s = b.fmul(_f16(b, k.wb, 0), k.dx, flags=_FM)
        xsum = _ld(b, k.sb, 0, I32)
        init = None
        if offset:  # the dot starts from -offset * sum(x_q) in lane 0 (offset is a power of two)
            neg = b.sub(ir.Constant(I32, 0), b.shl(xsum, ir.Constant(I32, offset.bit_length() - 1)))
            init = b.insert_element(ir.Constant(V8I32, None), neg, ir.Constant(I32, 0))
        t = _dot(b, k.v, init, chunk(b, k.v, _gep(b, k.wb, q_off), 0), _ld(b, k.xb, 0, V32I8), wide=offset >= 128)
        acc = _fma_acc(b, acc, t, s)
        if has_min:  # + m * (d_x * sum(x_q)): Q8_1's s, float32
            mt = b.fmul(_f16(b, k.wb, 2), _ld(b, k.sb, 0, F32T), flags=_FM)
            extra = b.fadd(extra, mt, flags=_FM)
        return acc, extra

    def pair(k0, k1, acc16, extra):
        """Two consecutive blocks with one 512-bit vpdpbusd (AVX512-VNNI): lanes 0-7 block k0,
        lanes 8-15 block k1; their activations are contiguous (planar layout), one 64-byte load."""
        b = k0.b
        s0 = b.fmul(_f16(b, k0.wb, 0), k0.dx, flags=_FM)
        s1 = b.fmul(_f16(b, k1.wb, 0), k1.dx, flags=_FM)
        xs0, xs1 = _ld(b, k0.sb, 0, I32), _ld(b, k1.sb, 0, I32)
        v16 = ir.VectorType(I32, 16)
        init = ir.Constant(v16, None)
        if offset:
            sh = ir.Constant(I32, offset.bit_length() - 1)
            for lane, xsum in ((0, xs0), (8, xs1)):
                neg = b.sub(ir.Constant(I32, 0), b.shl(xsum, sh))
                init = b.insert_element(init, neg, ir.Constant(I32, lane))
        u = b.shuffle_vector(chunk(b, k0.v, _gep(b, k0.wb, q_off), 0), chunk(b, k1.v, _gep(b, k1.wb, q_off), 0),
                             _vconst(range(64)))
        x = _ld(b, k0.xb, 0, ir.VectorType(I8, 64))
        fn = _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", v16, [v16, v16, v16])
        t = b.call(fn, [init, b.bitcast(u, v16), b.bitcast(x, v16)])
        v16f = ir.VectorType(F32T, 16)
        sv = b.insert_element(ir.Constant(v16f, None), s0, ir.Constant(I32, 0))
        sv = b.insert_element(sv, s1, ir.Constant(I32, 8))
        sv = b.shuffle_vector(sv, sv, _vconst([0] * 8 + [8] * 8))
        acc16 = b.fadd(acc16, b.fmul(b.sitofp(t, v16f), sv, flags=_FM), flags=_FM)
        if has_min:
            for k in (k0, k1):
                mt = b.fmul(_f16(b, k.wb, 2), _ld(b, k.sb, 0, F32T), flags=_FM)
                extra = b.fadd(extra, mt, flags=_FM)
        return acc16, extra

    emit.pair = pair
    return ts, 32, 1, emit


def _emit_q4k_like(q_off, chunk):
    def emit(k, acc, extra):
        b = k.b
        sc, mn = _kmask_q4k(b, k.wb)
        ai = _scaled_chunks(b, k.v, chunk, _gep(b, k.wb, q_off), k.xb, sc, 32)
        acc = _fma_acc(b, acc, ai, b.fmul(_f16(b, k.wb, _F["Q4_K"]["d"]), k.dx, flags=_FM))
        mins = b.mul(mn, _pairs16(b, k.bsums()))
        acc = _fma_acc(b, acc, mins, b.fneg(b.fmul(_f16(b, k.wb, _F["Q4_K"]["dmin"]), k.dx, flags=_FM)))
        return acc, extra
    return emit


def _q6k_scales(builder, wb):
    """Q6_K: the 16 int8 scales -> <16 x i32>."""
    return builder.sext(_ld(builder, wb, _F["Q6_K"]["scales"], V16I8), ir.VectorType(I32, 16))


def _emit_offset_k(name, scales, chunk, shift):
    """Q3_K / Q6_K: 16 signed scales per super-block, unsigned chunks of ``value + 2**shift`` (4, 32); the
    offset comes off as ``2**shift * sum(sc * bsums)``."""
    def emit(k, acc, extra):
        b = k.b
        sc = scales(b, k.wb)
        ai = _scaled_chunks(b, k.v, chunk, k.wb, k.xb, sc, 16)
        off = _fold16(b, b.mul(sc, k.bsums()))
        ai = b.sub(ai, b.shl(off, _vconst([shift] * 8)))
        return _fma_acc(b, acc, ai, b.fmul(_f16(b, k.wb, _F[name]["d"]), k.dx, flags=_FM)), extra
    return emit


def _emit_q2k(k, acc, extra):
    b = k.b
    v = _ld(b, k.wb, _F["Q2_K"]["scales"], V16I8)
    v16 = ir.VectorType(I32, 16)
    sc = b.zext(b.and_(v, _splat(I8, 16, 15)), v16)
    mn = b.zext(b.lshr(v, _splat(I8, 16, 4)), v16)
    ai = _scaled_chunks(b, k.v, _chunk_q2_k, _gep(b, k.wb, _F["Q2_K"]["qs"]), k.xb, sc, 16)
    acc = _fma_acc(b, acc, ai, b.fmul(_f16(b, k.wb, _F["Q2_K"]["d"]), k.dx, flags=_FM))
    mins = _fold16(b, b.mul(mn, k.bsums()))
    return _fma_acc(b, acc, mins, b.fneg(b.fmul(_f16(b, k.wb, _F["Q2_K"]["dmin"]), k.dx, flags=_FM))), extra


def _emit_iq4xs(k, acc, extra):
    b = k.b
    sc = _iq4xs_scales(b, k.wb)
    ai = _scaled_chunks(b, k.v, _chunk_iq4_xs, _gep(b, k.wb, _F["IQ4_XS"]["qs"]), k.xb, sc, 32, small=False)
    off = b.mul(sc, _pairs16(b, k.bsums()))
    ai = b.sub(ai, b.shl(off, _vconst([7] * 8)))  # - 128 * sum(sc * bsums)
    return _fma_acc(b, acc, ai, b.fmul(_f16(b, k.wb, _F["IQ4_XS"]["d"]), k.dx, flags=_FM)), extra


def legacy_emitter(name, chunk, offset):
    """The emitter of a 32-element type: its chunk loader reads from the block's first field after the scales
    (the type table's ``qh`` or ``qs``); a type with ``m`` adds Q8_1's min term."""
    t = type_info(name)
    q_off = t.field("qh" if "qh" in t.offsets else "qs")
    return _legacy(t.type_size, q_off, chunk, offset, "m" in t.offsets)[3]


def row_dot(variant, name, emit, nrows=1):
    """The ``ROW(wr, xq, xd, xs)`` intrinsic of type ``name`` for one IR variant ('vnni', 'avx2', 'neon'
    or 'generic'): the whole-row loop around the type's per-block ``emit`` (its row-dot entry in
    kernels/cpu_traits.py), block bytes, elements and activation sums from the type table. With ``nrows``
    > 1 it dots that many consecutive rows (``wr`` holds them one after another) with the same activations
    and returns a tuple; each row's sum is computed exactly as the 1-row dot's."""
    if variant not in ("vnni", "avx2", "neon", "generic"):
        raise ValueError(f"no IR dots for variant {variant!r}")
    info = type_info(name)
    ts, qk, ns = info.type_size, info.block_size, act_sums(name)
    unroll = 4 if qk == 32 else 2  # super-blocks: 4 measured no faster (Zen 5, 512-bit pairs)
    pair = getattr(emit, "pair", None) if (variant == "vnni" and HAS_VNNI512 and PAIRS_512 and nrows == 1) else None

    def impl(typingctx, wr, xq, xd, xs):
        sig = (types.float32 if nrows == 1 else types.UniTuple(types.float32, nrows))(wr, xq, xd, xs)

        def codegen(context, builder, signature, args):
            ta = signature.args
            zero = context.get_constant(types.intp, 0)
            wp0 = _byte_ptr(context, builder, ta[0], args[0], zero, types.intp)
            xp = _byte_ptr(context, builder, ta[1], args[1], zero, types.intp)
            dp = builder.bitcast(_byte_ptr(context, builder, ta[2], args[2], zero, types.intp), F32T.as_pointer())
            sp = _byte_ptr(context, builder, ta[3], args[3], zero, types.intp)  # i8*: int32 or float32 sums
            nb = cgutils.unpack_tuple(builder, context.make_array(ta[2])(context, builder, args[2]).shape)[0]
            # rows r = 0..nrows-1 lie one after another, nb blocks each; they share the activation loads
            rowbytes = builder.mul(nb, ir.Constant(nb.type, ts))
            wps = [builder.gep(wp0, [builder.mul(rowbytes, ir.Constant(nb.type, r))]) if r else wp0
                   for r in range(nrows)]
            # U independent accumulators per row: one fma chain per block would be latency-bound
            accps = [[cgutils.alloca_once_value(builder, ir.Constant(V8F32, None)) for _ in range(unroll)]
                     for _ in range(nrows)]
            extps = [[cgutils.alloca_once_value(builder, ir.Constant(F32T, 0.0)) for _ in range(unroll)]
                     for _ in range(nrows)]

            v16f = ir.VectorType(F32T, 16)
            acc16ps = [cgutils.alloca_once_value(builder, ir.Constant(v16f, None)) for _ in range(2)]

            def blk_at(i, r=0):
                return _Blk(builder, variant,
                            builder.gep(wps[r], [builder.mul(i, ir.Constant(i.type, ts))]),
                            builder.gep(xp, [builder.mul(i, ir.Constant(i.type, qk))]),
                            builder.load(builder.gep(dp, [i])),
                            builder.gep(sp, [builder.mul(i, ir.Constant(i.type, 4 * ns))]))

            def one(i, u, r=0):
                acc, ext = emit(blk_at(i, r), builder.load(accps[r][u]), builder.load(extps[r][u]))
                builder.store(acc, accps[r][u])
                builder.store(ext, extps[r][u])

            def two(i, u):  # blocks i, i+1 into the 512-bit accumulator u
                j = builder.add(i, ir.Constant(i.type, 1))
                acc, ext = pair(blk_at(i), blk_at(j), builder.load(acc16ps[u]), builder.load(extps[0][u]))
                builder.store(acc, acc16ps[u])
                builder.store(ext, extps[0][u])

            cu = ir.Constant(nb.type, unroll)
            nmain = builder.mul(builder.sdiv(nb, cu), cu)
            with cgutils.for_range_slice(builder, ir.Constant(nb.type, 0), nmain, cu) as (i, _):
                if PREFETCH:  # every 64-byte line of the blocks PREFETCH bytes ahead (prefetcht0)
                    pf = _decl(builder.module, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
                    for r in range(nrows):
                        base = builder.gep(wps[r], [builder.mul(i, ir.Constant(i.type, ts))])
                        for j in range(0, unroll * ts, 64):
                            builder.call(pf, [builder.gep(base, [ir.Constant(I64, PREFETCH + j)]),
                                              ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                if pair is not None:
                    two(i, 0)
                    two(builder.add(i, ir.Constant(i.type, 2)), 1)
                else:
                    for u in range(unroll):
                        for r in range(nrows):
                            one(builder.add(i, ir.Constant(i.type, u)), u, r)
            with cgutils.for_range(builder, nb, start=nmain) as loop:
                for r in range(nrows):
                    one(loop.index, 0, r)
            res = []
            for r in range(nrows):
                acc = builder.load(accps[r][0])
                ext = builder.load(extps[r][0])
                for u in range(1, unroll):
                    acc = builder.fadd(acc, builder.load(accps[r][u]), flags=_FM)
                    ext = builder.fadd(ext, builder.load(extps[r][u]), flags=_FM)
                if pair is not None:
                    a16 = builder.fadd(builder.load(acc16ps[0]), builder.load(acc16ps[1]), flags=_FM)
                    a8 = builder.fadd(_shuf(builder, a16, range(8)), _shuf(builder, a16, range(8, 16)), flags=_FM)
                    acc = builder.fadd(acc, a8, flags=_FM)
                for n in (4, 2, 1):  # tree reduction of the 8 lanes
                    lo = builder.shuffle_vector(acc, acc, _vconst(range(n)))
                    hi = builder.shuffle_vector(acc, acc, _vconst(range(n, 2 * n)))
                    acc = builder.fadd(lo, hi, flags=_FM)
                r_ = builder.extract_element(acc, ir.Constant(I32, 0))
                res.append(builder.fadd(r_, ext, flags=_FM))
            if nrows == 1:
                return res[0]
            return context.make_tuple(builder, signature.return_type, res)

        return sig, codegen

    impl.__name__ = f"row_{name.lower()}_{variant}" + (f"_x{nrows}" if nrows > 1 else "")
    return intrinsic(impl)

