"""The 8-row interleaved (x8) decode layout's IR: per type, the emitter of one group block's dots
(a type's ``X8`` entry, named by its record in kernels/cpu_traits.py) and the loop over a row group
(``row_dot_x8``). The shared helpers are in ``ir.py``."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.kernels.ir import (F32T, HAS_GFNI, I8, I16, I32, I64, V8F32, V8I32, V32I8, X8_PREFETCH, _FM,
                                 _byte_ptr, _decl, _dot, _dot_small, _e8m0_half, _fold16, _ld, _lut16, _pairs16,
                                 _shuf, _splat, _vconst, act_sums, int8_flavour)
from quantkit.formats.ggml_types import type_info
from quantkit.kernels.ir_rowdot import _IQ4_U
from quantkit.kernels.lowbit import _pow3, _top_trit


# -- 8-row interleaved ("x8") layout: one activation block serves 8 rows ------------------------------
#
# ggml's repacked CPU path (ggml-cpu/repack.cpp, block_q4_0x8 / block_q4_Kx8 ...) lays the blocks of 8
# consecutive rows side by side, so a 512-bit vpdpbusd multiplies 8 bytes of each of the 8 rows with one
# 8-byte activation group broadcast to all of them. Our x8 layout, per group of 8 rows and block index
# i (``pack_x8`` in vecdot.py writes it), every byte range [a, a + n) of the row's block becomes
# [8a, 8a + 8n) of the group's block: a header field (``X8``'s header: fp16 scales, sub-block scales) of
# e-byte elements holds element k of row r at 8a + (8k + r) * e (so the 8 rows' values of one element
# are one vector load); the quant bytes are 64-byte slices, slice j holding bytes 8j..8j+7 of each row's
# quants (row r at 8r). Only bytes move: the copy is as large as the file's matrix. Q6_K is the one
# exception (``Q6_K_ORDER``): its header comes first and its slices in the order its kernel first
# reads them.
#
# Lanes 2r and 2r+1 of a 16-lane vpdpbusd result belong to row r (``_pairs16`` adds them). Per block
# the emitters give the same integer dot (and sub-block scale / min / offset terms) as the 1-row loop
# and multiply-add them with the same float scale, once per row: the x8 result differs from the 1-row
# one only in the order the float terms are summed.

V16I32 = ir.VectorType(I32, 16)
V64I8 = ir.VectorType(I8, 64)
V8F16 = ir.VectorType(ir.HalfType(), 8)


def _bcast8(builder, xb, off):
    """The 8 activation bytes at xb+off repeated 8 times -> <64 x i8> (vpbroadcastq)."""
    q = _ld(builder, xb, off, I64)
    v = builder.insert_element(ir.Constant(ir.VectorType(I64, 8), None), q, ir.Constant(I32, 0))
    v = builder.shuffle_vector(v, v, _vconst([0] * 8))
    return builder.bitcast(v, V64I8)


def _bcast(builder, x, vty):
    v = builder.insert_element(ir.Constant(vty, None), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, vty.count), [0] * vty.count))


def _x8_f16(b, gb, off):
    """The 8 rows' fp16 field at group-block offset ``off`` -> <8 x float>."""
    return b.fpext(_ld(b, gb, off, V8F16), V8F32)


def _x8_e8m0(b, gb, off):
    """The 8 rows' MXFP4 scale bytes at group-block offset ``off`` -> <8 x float> (``ir._e8m0_half``)."""
    return _e8m0_half(b, b.zext(_ld(b, gb, off, ir.VectorType(I8, 8)), V8I32))


#: the x8 flavours that run a 64-byte vector as two 32-byte halves through ``ir._dot`` (its avx2 or
#: neon variant) instead of one 512-bit instruction
HALVES = ("avx2", "neon")


def _x8_dot(b, dpb, acc, u, xb, off, wide=False):
    """acc + vpdpbusd(u (8 bytes per row), activations xb[off:off+8] broadcast). ``dpb`` is the 512-bit
    vpdpbusd, or a flavour of ``HALVES``: then each 32-byte half of u (rows 0-3, rows 4-7) goes through
    that variant's ``_dot`` (``wide``: u may reach 128 and more, as ``_dot`` says; neon's splits it
    again into two ``sdot`` of 16 bytes, rows 0-1 and 2-3) and the two 8-lane results are the 16 lanes
    vpdpbusd gives (lanes 2r, 2r+1: row r)."""
    if dpb not in HALVES:
        return b.call(dpb, [acc, b.bitcast(u, V16I32), b.bitcast(_bcast8(b, xb, off), V16I32)])
    x = _bcast8_32(b, xb, off)
    lo, hi = (_dot(b, dpb, None, _half(b, u, h), x, wide=wide) for h in range(2))
    return b.add(acc, b.shuffle_vector(lo, hi, _vconst(range(16))))


def _bcast8_32(b, xb, off):
    """The 8 activation bytes at xb+off repeated 4 times -> <32 x i8> (a half's ``_bcast8``)."""
    q = _ld(b, xb, off, I64)
    x = b.insert_element(ir.Constant(ir.VectorType(I64, 4), None), q, ir.Constant(I32, 0))
    return b.bitcast(b.shuffle_vector(x, x, _vconst([0] * 4)), V32I8)


def _half(b, u, h):
    """Half h of <64 x i8> u: rows 0-3 (h = 0) or 4-7."""
    return b.shuffle_vector(u, u, _vconst(range(32 * h, 32 * h + 32)))


def _x8_dot_small(k, terms):
    """The sum of ``_x8_dot`` over ``terms`` ((u, activation offset) pairs) whose u are so small that all
    their ``vpmaddubsw`` pair sums add up within int16 (the TQ types: 32 dots of values 0..3 per block, at
    most 24576). On avx2 each half's products add up as int16 and widen once (``ir._dot_small``, as
    ggml's AVX2 TQ dots do), where ``_x8_dot`` widens each; elsewhere ``_x8_dot``'s."""
    b = k.b
    if k.dpb != "avx2":
        acc = ir.Constant(V16I32, None)
        for u, off in terms:
            acc = _x8_dot(b, k.dpb, acc, u, k.xb, off)
        return acc
    xs = [_bcast8_32(b, k.xb, off) for _, off in terms]
    lo, hi = (_dot_small(b, "avx2", [(_half(b, u, h), x) for (u, _), x in zip(terms, xs)]) for h in range(2))
    return b.shuffle_vector(lo, hi, _vconst(range(16)))


def _x8_bits(k, v, shift, width, to=0):
    """Bits shift..shift+width-1 of each byte of <64 x i8> v at bits to..to+width-1, the rest 0: one bit
    field of 64 packed quant bytes, moved into place (one GFNI affine, ``_gf2_bits``)."""
    return _gf2_bits(k, v, {to + e: shift + e for e in range(width)})


def _gf2_bits(k, v, moves):
    """Each byte of <64 x i8> v with its bits moved (``moves``: {bit out: bit in}), the other bits 0:
    one ``vgf2p8affineqb`` (a shift and a mask in one instruction; GFNI, with AVX-512: the 512-bit
    flavour only). The matrix byte 7 - o holds the input bits that make output bit o."""
    b = k.b
    if not (HAS_GFNI and k.dpb not in HALVES):  # the moves are one shift: shift and mask
        (d,) = {o - i for o, i in moves.items()}
        mask = _splat(I8, 64, sum(1 << o for o in moves))
        return b.and_(b.shl(v, _splat(I8, 64, d)) if d > 0 else b.lshr(v, _splat(I8, 64, -d)) if d else v, mask)
    row = [0] * 8
    for o, i in moves.items():
        row[7 - o] = 1 << i
    fn = _decl(b.module, "llvm.x86.vgf2p8affineqb.512", V64I8, [V64I8, V64I8, I8])
    return b.call(fn, [v, ir.Constant(V64I8, row * 8), ir.Constant(I8, 0)])


class _X8:
    """What an x8 emitter gets: builder, vpdpbusd (or a flavour of ``HALVES``, ``_x8_dot``), group-block pointer, this
    block's activations (quants, float scale, int32 sums pointer), and where its entry's x8 block puts
    things (``places``: ``x8_places`` of the entry)."""

    def __init__(self, b, dpb, gb, xb, dx, sb, places):
        self.b, self.dpb, self.gb, self.xb, self.dx, self.sb = b, dpb, gb, xb, dx, sb
        self.places = places

    def dxv(self):
        return _bcast(self.b, self.dx, V8F32)

    def xsum(self, i):
        return self.b.load(self.b.gep(self.sb, [ir.Constant(I64, i)]))

    def bsums(self):
        """The 16 activation sums of a super-block (one per 16 elements) -> <16 x i32>."""
        return _ld(self.b, self.b.bitcast(self.sb, I8.as_pointer()), 0, V16I32)

    def lut(self, table, idx):
        """<64 x i8> bytes of the 16-entry ``table`` at the nibble indices ``idx`` (pshufb)."""
        b = self.b
        if self.dpb not in HALVES:
            fn = _decl(b.module, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
            return b.call(fn, [ir.Constant(V64I8, list(table) * 4), idx])
        # pshufb on 32 bytes, or two neon tbl of 16
        lo, hi = (_lut16(b, self.dpb, _half(b, idx, h), table) for h in range(2))
        return b.shuffle_vector(lo, hi, _vconst(range(64)))

    def sums32(self):
        """The activation sums per 32 elements of a super-block -> <8 x i32>."""
        bsv = self.bsums()
        return self.b.add(_shuf(self.b, bsv, range(0, 16, 2)), _shuf(self.b, bsv, range(1, 16, 2)))


def _x8_pair(b, d0, d1):
    """Two sub-blocks' dots (<16 x i32>, row r in lanes 2r, 2r+1) -> one <16 x i32>: the 8 rows of the
    first, then of the second: so one multiply applies both sub-blocks' scales."""
    return b.add(b.shuffle_vector(d0, d1, _vconst(range(0, 32, 2))), b.shuffle_vector(d0, d1, _vconst(range(1, 32, 2))))


def _twice(p):
    """Lane selector for a sub-block pair's 16 lanes: [2p] * 8 + [2p + 1] * 8."""
    return [2 * p] * 8 + [2 * p + 1] * 8


# Each emitter: (k: _X8) -> [(<8 x i32> per-row integer, <8 x float> per-row scale)], summed as
# acc += float(integer) * scale.

def _x8_fifth(b, qh, c):
    """Byte ``c`` of the 8 rows' ``qh`` words (<8 x i32>; bit j of a row's word is the fifth bit of its
    element j, Q5_0 / Q5_1) as 16 or 0 per element: <64 x i8>, byte 8r + e from bit 8c + e of row r's
    word (elements 8c..8c+7: slice c's low nibbles, c < 2, or slice c - 2's high ones). The byte
    broadcast to its 8 places by one shuffle and tested against 1 << e, as ggml's AVX2
    ``bytes_from_bits_32`` (``vpshufb``, ``vpcmpeqb``; ``vptestmb`` with AVX-512). Not the 1-row loop's
    bitcast to <64 x i1> (``_bits_to_bytes``): LLVM built that without AVX-512 through the stack, and
    the SmolLM2 Q5_0 decode at QUANTKIT_KERNELS=avx2 ran at 44 t/s against 130 on the row dots."""
    v = b.bitcast(qh, V32I8)
    v = b.shuffle_vector(v, v, _vconst([4 * r + c for r in range(X8_ROWS) for _ in range(8)]))
    on = b.icmp_unsigned("!=", b.and_(v, ir.Constant(V64I8, [1 << e for e in range(8)] * X8_ROWS)), _splat(I8, 64, 0))
    return b.select(on, _splat(I8, 64, 16), _splat(I8, 64, 0))


def _x8_legacy(name, offset, table=None):
    """The 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4; their entry: ``legacy_x8``), at
    the x8 places of the type table's fields: d (and m) fp16 elements (MXFP4: its e8m0 byte ``e`` as
    ggml's GGML_E8M0_TO_FP32_HALF, its table's values doubled), Q5's qh one u32 per row, the quants
    in 64-byte slices: Q8_0's 4 of int8 (made unsigned by + 128), or 2 of nibbles (slice j: low nibbles
    elements 8j.., high ones 16 + 8j..), with Q5's fifth bits or'ed in (``_x8_fifth``) or IQ4_NL's
    table values + 128 looked up (``table``, as IQ4_XS). The unsigned values are the signed ones +
    ``offset``, taken off as offset * sum(x): d * d_x * dot; with m (Q4_1, Q5_1) + m * s_x, Q8_1's float
    s_x = fp16(d_x * sum(x)) as ggml's vec_dot takes it, entering the sum as the pair (1, m * s_x)."""
    t = type_info(name)
    at = {f: X8_ROWS * t.field(f) for f, _ in t.layout}  # the x8 places (x8_places: no slice order)
    nibbles = dict(t.layout)["qs"] == 16

    def emit(k):
        b = k.b
        acc = ir.Constant(V16I32, None)
        if nibbles:
            qh = _ld(b, k.gb, at["qh"], V8I32) if "qh" in at else None
            for j in range(2):
                v = _ld(b, k.gb, at["qs"] + 64 * j, V64I8)
                for h, u in enumerate((b.and_(v, _splat(I8, 64, 15)), b.lshr(v, _splat(I8, 64, 4)))):
                    if qh is not None:
                        u = b.or_(u, _x8_fifth(b, qh, 2 * h + j))
                    if table is not None:
                        u = k.lut(table, u)
                    acc = _x8_dot(b, k.dpb, acc, u, k.xb, 16 * h + 8 * j, wide=offset >= 128)
        else:  # Q8_0
            for j in range(4):
                u = b.xor(_ld(b, k.gb, at["qs"] + 64 * j, V64I8), _splat(I8, 64, 0x80))
                acc = _x8_dot(b, k.dpb, acc, u, k.xb, 8 * j, wide=True)
        t8 = _pairs16(b, acc)
        if offset:
            neg = b.shl(k.xsum(0), ir.Constant(I32, offset.bit_length() - 1))
            t8 = b.sub(t8, _bcast(b, neg, V8I32))
        d = _x8_e8m0(b, k.gb, at["e"]) if "e" in at else _x8_f16(b, k.gb, at["d"])
        out = [(t8, b.fmul(d, k.dxv(), flags=_FM))]
        if "m" in at:
            sx = b.load(b.bitcast(k.sb, F32T.as_pointer()))
            mt = b.fmul(_x8_f16(b, k.gb, at["m"]), _bcast(b, sx, V8F32), flags=_FM)
            out.append((ir.Constant(V8I32, [1] * 8), mt))
        return out
    return emit


def _x8_q4k_like(qs_off, qh_off=None):
    """Q4_K (and Q5_K, whose fifth bits ``qh`` sit before the nibbles): header d (0), dmin (16), the
    12 scale bytes as three u32 elements (32, 64, 96); nibbles from ``qs_off``: pair p of sub-blocks
    (2p low nibbles, 2p+1 high) in slices 4p..4p+3; Q5_K's qh in 4 slices from ``qh_off``, bit s of a
    byte the fifth bit of sub-block s."""
    def emit(k):
        b = k.b
        u0, u1, u2 = (_ld(b, k.gb, 32 + 32 * i, V8I32) for i in range(3))
        c = lambda n: _splat(I32, 8, n)  # noqa: E731
        k1, k2, k3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
        m47 = b.or_(b.and_(b.lshr(u2, c(4)), k2), b.shl(b.and_(b.lshr(u1, c(6)), k3), c(4)))
        m03 = b.and_(u1, k1)
        s47 = b.or_(b.and_(u2, k2), b.shl(b.and_(b.lshr(u0, c(6)), k3), c(4)))
        s03 = b.and_(u0, k1)

        def pair(w03, w47, p):  # bytes 2p, 2p+1 of the 8 rows' 8 (sub-blocks' scales or mins) -> <16 x i32>
            w = w03 if p < 2 else w47
            sh = _vconst([16 * (p % 2)] * 8 + [16 * (p % 2) + 8] * 8)
            return b.and_(b.lshr(b.shuffle_vector(w, w, _vconst(list(range(8)) * 2)), sh), _splat(I32, 16, 0xFF))

        def fifth(j, sub):  # bit ``sub`` of the qh slice j, as 16
            if qh_off is None:
                return None
            h = _ld(b, k.gb, qh_off + 64 * j, V64I8)
            return _x8_bits(k, h, sub, 1, 4)

        xs8 = k.sums32()
        isum = msum = None
        for p in range(4):  # sub-blocks 2p (low nibbles) and 2p + 1 (high): one zmm, rows of 2p then 2p + 1
            lo = hi = ir.Constant(V16I32, None)
            for j in range(4):
                v = _ld(b, k.gb, qs_off + 64 * (4 * p + j), V64I8)
                ul, uh = b.and_(v, _splat(I8, 64, 15)), b.lshr(v, _splat(I8, 64, 4))
                if qh_off is not None:
                    ul, uh = b.or_(ul, fifth(j, 2 * p)), b.or_(uh, fifth(j, 2 * p + 1))
                lo = _x8_dot(b, k.dpb, lo, ul, k.xb, 64 * p + 8 * j)
                hi = _x8_dot(b, k.dpb, hi, uh, k.xb, 64 * p + 32 + 8 * j)
            t = b.mul(_x8_pair(b, lo, hi), pair(s03, s47, p))
            m = b.mul(pair(m03, m47, p), _shuf(b, xs8, _twice(p)))
            isum = t if isum is None else b.add(isum, t)
            msum = m if msum is None else b.add(msum, m)
        dxv = k.dxv()
        return [(_fold16(b, isum), b.fmul(_x8_f16(b, k.gb, 0), dxv, flags=_FM)),
                (_fold16(b, msum), b.fneg(b.fmul(_x8_f16(b, k.gb, 16), dxv, flags=_FM)))]
    return emit


def _x8_scaled16(k, unpack, scale, unsigned, bias_shift):
    """The K types with one scale per 16 elements (Q2_K, Q3_K, Q6_K): for each sub-block g (0..15),
    the dot of its two slices' unsigned values (``unpack(g, s)`` -> <64 x i8> of its slice s = 2h, 2h + 1,
    h = g % 2: elements 16g + 8e, e = s - 2h, of the 8 rows) times its 8 rows' scale (``scale(g)`` -> (<8 x i32>, min or None)) -> summed per row. ``unsigned``
    False: the values are offset by 2**bias_shift, taken off each sub-block's dot as
    bsum << bias_shift (as ggml's dots do through the bsums, not per element); True (Q2_K): the scale's
    high nibble is a min, returned as the second sum (sum(min * bsums)).

    Sub-blocks go in pairs (g, g + 1): their two dots' per-row lane pairs are added into one zmm (the
    8 rows of g, then of g + 1), so one ``vpmulld`` applies both scales (one per two sub-blocks where
    a reduction per sub-block took a multiply for the scale and one for the offset). Integer sums:
    the same result in any order."""
    b = k.b
    bsv = k.bsums()
    if not unsigned:
        bsv = b.shl(bsv, _splat(I32, 16, bias_shift))
    isum = off = None
    for p in range(8):
        dots = []
        for g in (2 * p, 2 * p + 1):
            dot = ir.Constant(V16I32, None)
            for e in range(2):
                dot = _x8_dot(b, k.dpb, dot, unpack(g, 2 * (g % 2) + e), k.xb, 16 * g + 8 * e)
            dots.append(dot)
        t = _x8_pair(b, dots[0], dots[1])
        bs = _shuf(b, bsv, _twice(p))
        (sa, ma), (sb, mb) = scale(2 * p), scale(2 * p + 1)
        sc = b.shuffle_vector(sa, sb, _vconst(range(16)))
        if unsigned:
            t = b.mul(t, sc)
            o = b.mul(b.shuffle_vector(ma, mb, _vconst(range(16))), bs)
            off = o if off is None else b.add(off, o)
        else:
            t = b.mul(b.sub(t, bs), sc)
        isum = t if isum is None else b.add(isum, t)
    return _fold16(b, isum), (_fold16(b, off) if unsigned else None)


def _x8_q2_k(k):
    """Q2_K: scales (0: element g of row r at 8g + r; low nibble scale, high min), quants from 128
    (half n, shift j, slice s: qs slice 4n + s, elements 128n + 32j + 8s..), d (640), dmin (656)."""
    b = k.b

    def unpack(g, s):
        n, j = g // 8, g % 8 // 2
        return _x8_bits(k, _ld(b, k.gb, 128 + 64 * (4 * n + s), V64I8), 2 * j, 2)

    def scale(g):
        v = b.zext(_ld(b, k.gb, 8 * g, ir.VectorType(I8, 8)), V8I32)
        return b.and_(v, _splat(I32, 8, 15)), b.lshr(v, _splat(I32, 8, 4))

    isum, msum = _x8_scaled16(k, unpack, scale, True, 0)
    dxv = k.dxv()
    return [(isum, b.fmul(_x8_f16(b, k.gb, 640), dxv, flags=_FM)),
            (msum, b.fneg(b.fmul(_x8_f16(b, k.gb, 656), dxv, flags=_FM)))]


def _x8_q3_k(k):
    """Q3_K: hmask (0..255: 4 slices), qs (256..767: chunk c = 4n + j takes qs slices 4n.. shifted by
    2j and bit c of hmask), the 12 scale bytes as three u32 elements (768, 800, 832; decoded as
    ``_q3k_scales``), d (864). Values low2 + 4 * hbit, offset 4."""
    b = k.b
    c = lambda n: _splat(I32, 8, n)  # noqa: E731
    a0, a1, tmp = (_ld(b, k.gb, 768 + 32 * i, V8I32) for i in range(3))
    k1, k2 = c(0x03030303), c(0x0F0F0F0F)

    def hi(sh):
        return b.shl(b.and_(b.lshr(tmp, c(sh)) if sh else tmp, k1), c(4))

    aux = (b.or_(b.and_(a0, k2), hi(0)), b.or_(b.and_(a1, k2), hi(2)),
           b.or_(b.and_(b.lshr(a0, c(4)), k2), hi(4)), b.or_(b.and_(b.lshr(a1, c(4)), k2), hi(6)))

    def unpack(g, s):
        ch = g // 2
        n, j = divmod(ch, 4)
        low = _x8_bits(k, _ld(b, k.gb, 256 + 64 * (4 * n + s), V64I8), 2 * j, 2)
        return b.or_(low, _x8_bits(k, _ld(b, k.gb, 64 * s, V64I8), ch, 1, 2))

    def scale(g):
        w = aux[g // 4]
        q = g % 4
        return b.sub(b.and_(b.lshr(w, c(8 * q)) if q else w, c(0xFF)), c(32)), None

    isum, _ = _x8_scaled16(k, unpack, scale, False, 2)
    return [(isum, b.fmul(_x8_f16(b, k.gb, 864), k.dxv(), flags=_FM))]


def _x8_q6_k(k):
    """Q6_K, header first (its entry's ``order``; ``k.places``): the 16 int8 scales (element g of row r
    at 8g + r), d (128), then the 24 slices of ql (row bytes 0..127: slice 8n + 4h + s, half n, nibble
    chunk h) and qh (row bytes 128..191: slice 16 + 4n + s) from 144 in ``Q6_K_ORDER``. Per 16 elements:
    2 slices, one scale. The unpack puts qh's two bits in place with one GFNI affine (``_gf2_bits``)."""
    b = k.b
    lo4, hi2 = _splat(I8, 64, 0x0F), _splat(I8, 64, 0x30)
    (sc_at, d_at), q_at, order = k.places
    slot = {j: q_at + 64 * pos for pos, j in enumerate(order)}

    def unpack(g, s):
        n, i = g // 8, g % 8 // 2  # chunk i of half n
        ql = _ld(b, k.gb, slot[8 * n + 4 * (i % 2) + s], V64I8)
        qh = _ld(b, k.gb, slot[16 + 4 * n + s], V64I8)
        # ql's nibble to bits 0..3, bits 2i, 2i+1 of qh to bits 4, 5, the rest 0
        lo = b.and_(ql, lo4) if i < 2 else _x8_bits(k, ql, 4, 4)
        return b.or_(lo, b.and_(qh, hi2) if i == 2 else _x8_bits(k, qh, 2 * i, 2, 4))

    def scale(g):
        return b.sext(_ld(b, k.gb, sc_at + 8 * g, ir.VectorType(I8, 8)), V8I32), None

    isum, _ = _x8_scaled16(k, unpack, scale, False, 5)  # sub-block dots - 32 * bsums
    return [(isum, b.fmul(_x8_f16(b, k.gb, d_at), k.dxv(), flags=_FM))]


def _x8_iq4_xs(k):
    """IQ4_XS: header d (0), scales_h (16, u16 elements), scales_l (32, u32 elements); quants from 64:
    chunk c (32 elements) in slices 2c, 2c+1 (slice 2c+h: low nibbles elements 8h.., high 16+8h..),
    table values + 128 through a 512-bit pshufb; chunks in pairs as the K types' sub-blocks."""
    b = k.b
    dup = lambda v: b.shuffle_vector(v, v, _vconst(list(range(8)) * 2))  # noqa: E731  (both halves: a pair's)
    sh = dup(b.zext(_ld(b, k.gb, 16, ir.VectorType(I16, 8)), V8I32))
    sl = dup(_ld(b, k.gb, 32, V8I32))
    c = lambda n: _splat(I32, 16, n)  # noqa: E731
    xs = b.shl(k.sums32(), _splat(I32, 8, 7))  # 128 * sums: the table values' offset
    isum = None
    for p in range(4):
        dots = []
        for ch in (2 * p, 2 * p + 1):
            dot = ir.Constant(V16I32, None)
            for h in range(2):
                v = _ld(b, k.gb, 64 + 64 * (2 * ch + h), V64I8)
                lo = k.lut(_IQ4_U, b.and_(v, _splat(I8, 64, 15)))
                hi = k.lut(_IQ4_U, b.lshr(v, _splat(I8, 64, 4)))
                dot = _x8_dot(b, k.dpb, dot, lo, k.xb, 32 * ch + 8 * h, wide=True)
                dot = _x8_dot(b, k.dpb, dot, hi, k.xb, 32 * ch + 16 + 8 * h, wide=True)
            dots.append(dot)
        low = b.and_(b.lshr(sl, _vconst([4 * e for e in _twice(p)])), c(15))
        high = b.shl(b.and_(b.lshr(sh, _vconst([2 * e for e in _twice(p)])), c(3)), c(4))
        sc = b.sub(b.or_(low, high), c(32))
        t = b.mul(b.sub(_x8_pair(b, *dots), _shuf(b, xs, _twice(p))), sc)
        isum = t if isum is None else b.add(isum, t)
    return [(_fold16(b, isum), b.fmul(_x8_f16(b, k.gb, 0), k.dxv(), flags=_FM))]


def _x8_tq2_0(k):
    """TQ2_0: qs (row bytes 0..63: slices 0..7), d (fp16) at 512. Row byte 32n + m holds elements
    128n + 32l + m in bits 2l, 2l + 1 (ggml's dequantize_row_tq2_0, the same bytes as Q2_K's qs), so
    slice s shifted by 2l is elements 128 (s // 4) + 32 l + 8 (s % 4) .. + 7 of the 8 rows. Values 0..2,
    offset 1: the dot less the super-block's activation sum; one scale, d."""
    b = k.b
    (d_at,), q_at, _ = k.places
    three = _splat(I8, 64, 3)
    terms = []
    for s in range(8):
        v = _ld(b, k.gb, q_at + 64 * s, V64I8)
        for sh in range(4):
            u = b.and_(b.lshr(v, _splat(I8, 64, 2 * sh)) if sh else v, three)
            terms.append((u, 128 * (s // 4) + 32 * sh + 8 * (s % 4)))
    acc = _x8_dot_small(k, terms)
    total = b.call(_decl(b.module, "llvm.vector.reduce.add.v16i32", I32, [V16I32]), [k.bsums()])
    t8 = b.sub(_pairs16(b, acc), _bcast(b, total, V8I32))
    return [(t8, b.fmul(_x8_f16(b, k.gb, d_at), k.dxv(), flags=_FM))]


def _x8_tq1_0(k):
    """TQ1_0: qs (row bytes 0..47: slices 0..5), qh (one u32 element per row, 384), d (fp16, 416). Trit n
    of qs byte m (the top digit of its ``* 3**n``, lowbit.py's ``_chunk_tq1_0``) is element 32n + m for m
    < 32, 160 + 16n + (m - 32) above, so slice s shifted by n is elements 32n + 8s .. (s < 4) or 160 +
    16n + 8(s - 4) ..; trit n of qh byte j is element 240 + 4n + j: each row's four qh bytes twice, times
    3**n for n = 0, 1 (elements 240..247) and 2, 3 (248..255). Values 0..2, offset 1 as TQ2_0's."""
    b = k.b
    (qh_at, d_at), q_at, _ = k.places
    flip = _splat(I8, 64, 0x80)
    terms = []
    for s in range(6):
        v = b.xor(_ld(b, k.gb, q_at + 64 * s, V64I8), flip)
        for n in range(5):
            off = 32 * n + 8 * s if s < 4 else 160 + 16 * n + 8 * (s - 4)
            terms.append((_top_trit(b, _pow3(b, v, n)), off))
    qh = _ld(b, k.gb, qh_at, V32I8)  # row r's four bytes at 4r
    qh = b.xor(b.shuffle_vector(qh, qh, _vconst([4 * r + e % 4 for r in range(X8_ROWS) for e in range(8)])), flip)
    for h in range(2):
        terms.append((_top_trit(b, b.mul(qh, _vconst([3 ** (2 * h + e // 4) for e in range(8)] * X8_ROWS, I8))),
                      240 + 8 * h))
    acc = _x8_dot_small(k, terms)
    total = b.call(_decl(b.module, "llvm.vector.reduce.add.v16i32", I32, [V16I32]), [k.bsums()])
    t8 = b.sub(_pairs16(b, acc), _bcast(b, total, V8I32))
    return [(t8, b.fmul(_x8_f16(b, k.gb, d_at), k.dxv(), flags=_FM))]


class X8:
    """A type's x8 entry (its record's interleaved-layout column, kernels/cpu_traits.py), its layout facts
    from the type table (formats/ggml_types.py): ``header`` names the block's header fields with their
    element bytes (2: fp16, 4: u32 words of packed scales, 1: bytes); every other field holds quant bytes,
    and they must be contiguous; ``emit`` the dot emitter. ``order``: the quant slices' order where the
    x8 block puts its header first and the slices in its kernel's reading order instead of the row
    block's; ``unroll``: blocks per loop iteration (and float accumulators) where not the default of 4
    (32-element blocks) or 2 (super-blocks).

    Derived: ``ts`` block bytes of one row, ``qk`` elements per block, ``ns`` activation sums per block,
    ``fields`` the header fields ((offset, bytes, element bytes) in the row's block, in layout order),
    ``quant`` the quant bytes (start, end)."""

    def __init__(self, name, header, emit, order=None, unroll=None):
        t = type_info(name)
        self.name, self.emit, self.order = name, emit, order
        self.ts, self.qk, self.ns = t.type_size, t.block_size, act_sums(name)
        self.fields = tuple((t.field(f), n, header[f]) for f, n in t.layout if f in header)
        quant = [(t.field(f), n) for f, n in t.layout if f not in header]
        self.quant = quant[0][0], quant[-1][0] + quant[-1][1]
        assert self.quant[1] - self.quant[0] == sum(n for _, n in quant), f"{name}: quant fields not contiguous"
        self.unroll = unroll or (4 if self.qk == 32 else 2)


KS = {"d": 2, "dmin": 2, "scales": 4}


def legacy_x8(name, offset, table=None):
    """The x8 entry of a 32-element type (``_x8_legacy``): its fp16 d and m (MXFP4: the e8m0 byte e),
    and Q5's qh (u32 words) in the header; ``offset`` and ``table`` as ``_x8_legacy`` takes them."""
    header = {f: n for f, n in (("d", 2), ("m", 2), ("e", 1), ("qh", 4)) if f in type_info(name).offsets}
    return X8(name, header, _x8_legacy(name, offset, table))


#: rows per interleaved group
X8_ROWS = 8

#: Q6_K's x8 slice order (``X8.order``). Its kernel reads ql and qh slices of a half together and its
#: scales with the first pair: in the row block's order (ql 0..1023, qh 1024..1535, scales 1536) the
#: reads of a block jump back and forth over 1.7 KB, and Zen 4's prefetchers, which follow ascending
#: streams, stopped: one thread read a Q6_K matrix from DRAM at 7-8 GB/s against 25-27 for Q4_K / Q4_0
#: (docs/performance.md). In the order of first reads (per half n: ql chunk 0 and qh alternating, then ql
#: chunk 1) it reads at 20-23 GB/s. Its unroll is 1: at two threads on Zen 4 its GEMV from DRAM streamed at
#: 26-31 GB/s against 23-26 with two, cache-resident rates equal (docs/performance.md, "Decode on two
#: threads").
Q6_K_ORDER = tuple(j for n in range(2) for j in
                   [x for s in range(4) for x in (8 * n + s, 16 + 4 * n + s)] + [8 * n + 4 + s for s in range(4)])


def x8_places(spec):
    """Where the x8 block of an ``X8`` entry puts things: (the x8 offset of each header field, in its
    ``fields`` order; the offset of the first quant slice; the slice order, None for the row block's)."""
    q0, q1 = spec.quant
    if spec.order is None:
        return [X8_ROWS * off for off, _, _ in spec.fields], X8_ROWS * q0, None
    at, offs = 0, []
    for _, size, _ in spec.fields:
        offs.append(at)
        at += X8_ROWS * size
    assert sorted(spec.order) == list(range((q1 - q0) // 8)) and at + X8_ROWS * (q1 - q0) == X8_ROWS * spec.ts
    return offs, at, list(spec.order)


#: which x8 dots a kernel variant gets (None: no x8 layout)
x8_flavour = int8_flavour


def row_dot_x8(spec, flavour):
    """The ``ROWX8(wg, xq, xd, xs) -> 8 x float32`` intrinsic of an ``X8`` entry: the dots of the 8 rows of
    one x8 group (``wg``: its nb * 8 * block bytes) with one token's activations, for an ``x8_flavour``."""
    name, ts, qk, ns, emit, unroll = spec.name, spec.ts, spec.qk, spec.ns, spec.emit, spec.unroll
    places = x8_places(spec)
    gts = X8_ROWS * ts

    def impl(typingctx, wg, xq, xd, xs):
        sig = types.UniTuple(types.float32, X8_ROWS)(wg, xq, xd, xs)

        def codegen(context, builder, signature, args):
            b = builder
            ta = signature.args
            zero = context.get_constant(types.intp, 0)
            wp = _byte_ptr(context, b, ta[0], args[0], zero, types.intp)
            xp = _byte_ptr(context, b, ta[1], args[1], zero, types.intp)
            dp = b.bitcast(_byte_ptr(context, b, ta[2], args[2], zero, types.intp), F32T.as_pointer())
            sp = b.bitcast(_byte_ptr(context, b, ta[3], args[3], zero, types.intp), I32.as_pointer())
            nb = cgutils.unpack_tuple(b, context.make_array(ta[2])(context, b, args[2]).shape)[0]
            dpb = (flavour if flavour in HALVES else
                   _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32, V16I32, V16I32]))
            pf = _decl(b.module, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
            accps = [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(unroll)]

            def one(i, u):
                k = _X8(b, dpb, b.gep(wp, [b.mul(i, ir.Constant(i.type, gts))]),
                        b.gep(xp, [b.mul(i, ir.Constant(i.type, qk))]), b.load(b.gep(dp, [i])),
                        b.gep(sp, [b.mul(i, ir.Constant(i.type, ns))]), places)
                acc = b.load(accps[u])
                for iv, sv in emit(k):
                    acc = b.fadd(acc, b.fmul(b.sitofp(iv, V8F32), sv, flags=_FM), flags=_FM)
                b.store(acc, accps[u])

            cu = ir.Constant(nb.type, unroll)
            nmain = b.mul(b.sdiv(nb, cu), cu)
            with cgutils.for_range_slice(b, ir.Constant(nb.type, 0), nmain, cu) as (i, _):
                if X8_PREFETCH:
                    base = b.gep(wp, [b.mul(i, ir.Constant(i.type, gts))])
                    for j in range(0, unroll * gts, 64):
                        b.call(pf, [b.gep(base, [ir.Constant(I64, X8_PREFETCH + j)]),
                                    ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                for u in range(unroll):
                    one(b.add(i, ir.Constant(i.type, u)), u)
            with cgutils.for_range(b, nb, start=nmain) as loop:
                one(loop.index, 0)
            accs = [b.load(a) for a in accps]
            while len(accs) > 1:
                accs = [b.fadd(accs[i], accs[i + 1], flags=_FM) for i in range(0, len(accs), 2)]
            res = [b.extract_element(accs[0], ir.Constant(I32, r)) for r in range(X8_ROWS)]
            return context.make_tuple(b, signature.return_type, res)

        return sig, codegen

    impl.__name__ = f"row_{name.lower()}_x8_{flavour}"
    return intrinsic(impl)

