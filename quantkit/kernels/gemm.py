"""Prefill GEMM on integer dot products: quantized weights x Q8 activations (512-bit ``vpdpbusd`` at
avx512vnni; the other flavours below).

ggml multiplies a batch by converting the activations once to the weight type's vec_dot type (Q8_0,
Q8_1, Q8_K) and running integer block dots (ggml-cpu.c ``ggml_compute_forward_mul_mat``; repack.cpp's
``gemm_*`` kernels on interleaved weights). This module does the same with its own layout:

* **Unpack once per tile.** Each thread takes a tile of weight rows and unpacks it, with the chunk
  loaders of ``ir_rowdot.py``, into unsigned bytes ``u`` interleaved 16 rows at a time: for every group of 4
  consecutive elements, 16 rows x 4 bytes = one 64-byte ``zmm``. Beside them, per row: the block's float
  scale ``d`` (and ``-dmin`` / ``m``), the K types' integer sub-block scales and mins. The 16 rows of a
  sub-tile are decoded together and transposed in registers, so every store is a whole ``zmm``.
* **Register-blocked micro-kernel** (2 sub-tiles of 16 rows x ``COLS / 2`` tokens; an odd last
  sub-tile: 16 rows x ``COLS``). One ``vpdpbusd zmm`` multiplies the 4-element group of all 16 rows
  (unsigned, from the tile) with the same 4 activation bytes of one token (signed, broadcast): lane r
  accumulates row r, so no horizontal sums. Each 64-byte weight load serves 4 tokens, each broadcast
  32 rows: 6 loads per 8 ``vpdpbusd`` (16 x 8 took 9, and the loads were the bound; docs/kernels.md).
* **The integer math of ggml's vec_dots.** Signed formats are ``u - offset`` (as in ir.py): the
  accumulator of a group starts at ``-offset * sum(x_q)`` (the activation group sums times the offset,
  made once per product). Per 32-element block: ``d_w * d_x * int``. Per 256 super-block: groups of
  32 (Q4_K, Q5_K, IQ4_XS) or 16 (Q6_K, Q3_K, Q2_K) weighted by their integer scale (``vpmulld``), the
  mins as ``vpdpwssd`` of int16 (min, min) pairs with the activation group sums, one float multiply-add
  per super-block; Q4_1/Q5_1's ``m * s`` (Q8_1's float s) in float. Groups of 16 (twice as many scale
  products per element) are weighted in float instead: ``float(int) * float(scale)``, summed in
  float32 -- Q6_K 1.2-1.3x faster than with ``vpmulld``; for groups of 32 the integer form is faster
  (Q4_K 1.1-1.5x), measured in CPU time at 1 thread, 512 tokens x 2048/8192 x 2048.

The sum over a row's blocks is in float32 in a fixed order (blocks in order, one accumulator per
output), so results do not depend on the thread count or on how tokens are grouped. Needs AVX512-VNNI
(``ir.HAS_VNNI512``) for the ``vnni`` flavour; the ``avx2`` flavour (``_Ops``, ``ir.int8_flavour``) runs the
same tiles on AVX2 with half the tokens per micro-kernel, the ``neon`` flavour on AArch64's ``sdot``
(also half the tokens), the ``i8mm`` flavour on its ``smmla`` (``_group_mm``; ``ir.gemm_flavour``);
elsewhere ``mul_mat`` keeps its dequantize + BLAS prefill.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.formats.ggml_types import type_info
from quantkit.jit import (addr_of, call_addr, frozen, prange, specialize, view_f32, view_i8, view_i16, view_i32,
                          view_i64, view_u8, view_u8_ro)
from quantkit.kernels import ir_rowdot as kir
from quantkit.kernels.activations import ACT_QUANTIZER_ROWS, empty_activations
from quantkit.kernels.ir import (F32T, I8, I16, I32, I64, V4I32, V8I32, V16I8, V16I16, V32I8, _byte_ptr, _decl, _f16, _gep,
                                 _ld, _madd16, _maddubs, _pairs_to_lanes, _sdot, _splat)

#: tokens per micro-kernel call (activation columns held in registers)
COLS = 8
#: rows per micro-kernel (one zmm of int32 / float32 lanes)
LANES = 16

V16I32 = ir.VectorType(I32, 16)
V16F32 = ir.VectorType(F32T, 16)


class Spec:
    """How one weight type enters the GEMM.

    From the type table (formats/ggml_types.py): ``qk`` elements per block of the micro-kernel -- the
    type's (super-)block, or its activation kind's block where that is shorter (Q1_0: 128 weights against
    Q8_0's 32, so four such blocks share a weight block's scales; ``per`` of them per weight block),
    ``act`` the activation kind (its ``vec_dot_type``), ``q_off`` the byte offset of ``q_field``, the
    field the chunk loader reads from. Given here: ``g`` elements per scaled group (``qk`` for
    32-blocks); ``offset``: u - offset is the signed value (0: none); ``mins``: 'int' (K-quant mins, via
    the group sums), 'float' (Q8_1's ``m * s``) or None; ``chunk(b, var, p, k)`` -> <32 x i8> unsigned
    values of the weight block's chunk k (ir.py's loaders); ``scales(b, wb)`` -> (<n x i32> sub-block
    scales or None, <n x i32> mins or None, d, dmin-or-m) of the weight block."""

    def __init__(self, t, g, offset, mins, chunk, q_field, scales):
        info = type_info(t.name)
        self.act, self.q_off = info.vec_dot_type, info.field(q_field)
        self.qk = min(info.block_size, type_info(self.act).block_size)
        self.per = info.block_size // self.qk
        self.g, self.offset, self.mins = g or self.qk, offset, mins
        self.chunk, self.scales = chunk, scales
        self.ng = self.qk // self.g  # groups per block
        assert self.per == 1 or (self.ng == 1 and mins is None), "shared scales: only d per weight block"


#: the byte offsets of the fields the scale readers below take, from the type table
_F = {n: type_info(n).offsets for n in ("Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ4_XS")}


def _legacy_scales(has_min):
    f = _F["Q4_1" if has_min else "Q4_0"]  # Q5_0 / Q5_1 / Q8_0 / IQ4_NL: d (and m) where these have them

    def sc(b, wb):
        return None, None, _f16(b, wb, f["d"]), (_f16(b, wb, f["m"]) if has_min else None)
    return sc


def _q4k_scales(b, wb):  # Q5_K: d, dmin, scales where Q4_K has them
    sc, mn = kir._kmask_q4k(b, wb)
    return sc, mn, _f16(b, wb, _F["Q4_K"]["d"]), b.fneg(_f16(b, wb, _F["Q4_K"]["dmin"]))


def _q6k_scales(b, wb):
    f = _F["Q6_K"]
    return b.sext(_ld(b, wb, f["scales"], ir.VectorType(I8, 16)), V16I32), None, _f16(b, wb, f["d"]), None


def _q3k_scales(b, wb):
    return kir._q3k_scales(b, wb), None, _f16(b, wb, _F["Q3_K"]["d"]), None


def _q2k_scales(b, wb):
    f = _F["Q2_K"]
    v = _ld(b, wb, f["scales"], ir.VectorType(I8, 16))
    sc = b.zext(b.and_(v, _splat(I8, 16, 15)), V16I32)
    mn = b.zext(b.lshr(v, _splat(I8, 16, 4)), V16I32)
    return sc, mn, _f16(b, wb, f["d"]), b.fneg(_f16(b, wb, f["dmin"]))


def _iq4xs_scales(b, wb):
    return kir._iq4xs_scales(b, wb), None, _f16(b, wb, _F["IQ4_XS"]["d"]), None


# -- tile layout (per 16-row sub-tile, nsb blocks per row) ------------------------------------------
#   wu  uint8   [nsb][qk/4][16][4]      unsigned values, 4-element groups of 16 rows
#   sc  int32   [nsb][ng][16]           sub-block scales (K types)
#   mn  int16   [nsb][ng/2][16][2]      (min, min) pairs of consecutive groups (int mins)
#   dd  float32 [nsb][16]               d
#   dm  float32 [nsb][16]               -dmin (int mins) or m (float mins)


def _ptr(context, builder, aty, aval):
    return _byte_ptr(context, builder, aty, aval, context.get_constant(types.intp, 0), types.intp)


def _at(builder, p, off, ty):
    """Load ``ty`` at byte offset ``off`` (an i64 value or int) of i8* ``p``."""
    q = builder.gep(p, [off if isinstance(off, ir.Value) else ir.Constant(I64, off)])
    return builder.load(builder.bitcast(q, ty.as_pointer()), align=1)


def _put(builder, p, off, val):
    q = builder.gep(p, [off if isinstance(off, ir.Value) else ir.Constant(I64, off)])
    builder.store(val, builder.bitcast(q, val.type.as_pointer()), align=1)


def _i64(builder, v):
    return v if v.type == I64 else builder.sext(v, I64)


def _mul(builder, a, c):
    return builder.mul(a, ir.Constant(I64, c))


def _transpose16x8(b, c):
    """16 rows' <8 x i32> (one 32-element chunk each: 8 groups of 4 bytes) -> 8 <16 x i32>, group g's
    vector holding row r's 4 bytes in lane r: three rounds of two-source shuffles (``vpermt2d``)."""
    def shuf(x, y, mask):
        return b.shuffle_vector(x, y, ir.Constant(V16I32, mask))
    p = [shuf(c[2 * a], c[2 * a + 1], list(range(16))) for a in range(8)]          # rows 2a, 2a+1
    q = [[shuf(p[2 * a], p[2 * a + 1], [(rr // 2) * 16 + (rr % 2) * 8 + 4 * h + g
                                         for g in range(4) for rr in range(4)])
          for h in range(2)] for a in range(4)]                                    # 4 rows x 4 groups
    z = [[[shuf(q[2 * a][h], q[2 * a + 1][h], [(rr // 4) * 16 + (2 * k + gg) * 4 + rr % 4
                                                for gg in range(2) for rr in range(8)])
           for k in range(2)] for h in range(2)] for a in range(2)]                # 8 rows x 2 groups
    return [shuf(z[0][g // 4][(g // 2) % 2], z[1][g // 4][(g // 2) % 2],
                 [(r // 8) * 16 + (g % 2) * 8 + r % 8 for r in range(16)]) for g in range(8)]


def _gather16(b, vals, ty):
    """16 scalars -> one <16 x ty> (lane r = vals[r])."""
    v = ir.Constant(ty, None)
    for r, x in enumerate(vals):
        v = b.insert_element(v, x, ir.Constant(I32, r))
    return v


def _store_lanes(b, p, off, rowvecs):
    """Store 16 rows' <n x i32> (n = 4, 8 or 16) at byte ``off`` of ``p`` as n <16 x i32>, element e of
    row r in lane r of vector e (``_transpose16x8`` per 8 elements)."""
    n = rowvecs[0].type.count
    for h in range(0, n, 8):
        idx = [h + min(e, n - 1 - h) for e in range(8)]
        part = [b.shuffle_vector(v, v, ir.Constant(V8I32, idx)) for v in rowvecs]
        for j, v in enumerate(_transpose16x8(b, part)[:min(8, n - h)]):
            _put(b, p, b.add(off, ir.Constant(I64, (h + j) * 64)), v)


def _unpack_tile(name: str, spec: Spec, ts: int, flavour: str = "vnni"):
    """``unpack(w, r0, nr, wu, sc, mn, dd, dm)``: weight rows r0 .. r0 + nr - 1 (nr <= 16) of w (uint8
    (n_out, row_bytes)) into a 16-row sub-tile (layout above); the lanes past nr repeat the last row.
    Per 32-element chunk the 16 rows' decoded bytes are transposed in registers (``_transpose16x8``)
    and stored as 8 whole ``zmm`` -- one row at a time took 8 scalar stores per chunk, and the unpack
    then cost ~6 % of a 512-token product."""
    qk, ng, per = spec.qk * spec.per, spec.ng, spec.per  # qk: the weight block's elements here

    def impl(typingctx, w, r0, nr, wu, sc, mn, dd, dm):
        sig = types.void(w, r0, nr, wu, sc, mn, dd, dm)

        def codegen(context, builder, signature, args):
            ta = signature.args
            b = builder
            wp, up, sp, mp, dp, ep = (_ptr(context, b, ta[i], args[i]) for i in (0, 3, 4, 5, 6, 7))
            r0_, nr_ = (_i64(b, context.cast(b, args[i], ta[i], types.intp)) for i in (1, 2))
            wa = context.make_array(ta[0])(context, b, args[0])
            nbytes = _i64(b, cgutils.unpack_tuple(b, wa.shape)[1])
            stride = _i64(b, cgutils.unpack_tuple(b, wa.strides)[0])
            last = b.sub(nr_, ir.Constant(I64, 1))
            rows = []
            for r in range(LANES):
                rr = b.select(b.icmp_signed("<", ir.Constant(I64, r), nr_), ir.Constant(I64, r), last)
                rows.append(b.gep(wp, [b.mul(b.add(r0_, rr), stride)]))
            nsb = b.sdiv(nbytes, ir.Constant(I64, ts))
            with cgutils.for_range(b, nsb) as loop:
                i = loop.index
                wbs = [b.gep(rp, [_mul(b, i, ts)]) for rp in rows]
                ub = b.gep(up, [_mul(b, i, qk * LANES)])
                for k in range(qk // 32):
                    c = [b.bitcast(spec.chunk(b, flavour, _gep(b, wb, spec.q_off), k), V8I32) for wb in wbs]
                    for j, v in enumerate(_transpose16x8(b, c)):
                        _put(b, ub, (8 * k + j) * 64, v)
                rs = [spec.scales(b, wb) for wb in wbs]  # per row: (scales, mins, d, dmin-or-m)
                dv = _gather16(b, [x[2] for x in rs], V16F32)
                for v in range(per):                            # [sb][16] float, per micro-kernel block
                    _put(b, dp, _mul(b, i, 4 * LANES * per) if v == 0 else
                         b.add(_mul(b, i, 4 * LANES * per), ir.Constant(I64, 4 * LANES * v)), dv)
                row_off = _mul(b, i, 4 * LANES)
                if rs[0][3] is not None:
                    _put(b, ep, row_off, _gather16(b, [x[3] for x in rs], V16F32))
                if rs[0][0] is not None:                        # [sb][g][16] int32
                    _store_lanes(b, sp, _mul(b, i, 4 * ng * LANES), [x[0] for x in rs])
                if rs[0][1] is not None:                        # [sb][g/2][16][2] int16: (min, min) pairs
                    pairs = [b.bitcast(b.trunc(x[1], ir.VectorType(I16, ng)), ir.VectorType(I32, ng // 2))
                             for x in rs]
                    _store_lanes(b, mp, _mul(b, i, 2 * ng * LANES), pairs)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"gemm_unpack_{name}_{flavour}"
    return intrinsic(impl)


def _splat16(builder, scalar):
    ty = ir.VectorType(scalar.type, 16)
    v = builder.insert_element(ir.Constant(ty, None), scalar, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(V16I32, [0] * 16))


_FM = ("contract",)


class _Ops:
    """The micro-kernel's integer products on 16 int32 lanes (one per weight row), per flavour
    (``ir.int8_flavour``). ``vnni``: one 512-bit ``vpdpbusd`` / ``vpdpwssd``. ``avx2``: each 64-byte
    weight vector as two 32-byte halves (rows 0-7, rows 8-15) through ``vpmaddubsw`` + ``vpmaddwd``
    (ggml's AVX2 dots); for the types whose unsigned values are offset by 128 (``signed``: Q8_0,
    IQ4_NL, IQ4_XS, whose values reach 255 and would saturate ``vpmaddubsw``'s int16 pairs) the weights
    are made signed again (``u ^ 0x80``) and multiplied with ggml's sign trick, so their dots need no
    ``-128 * sum(x)`` start. ``neon``: four 16-byte quarters (rows 0-3, 4-7, 8-11, 12-15), one ``sdot``
    each (s8 x s8: unsigned values below 128 are their own signed bytes; those offset by 128 made
    signed as for avx2); the mins' int16 pairs by widening multiplies. ``i8mm``: ``smmla`` on pairs of
    rows x pairs of tokens (``_group_mm``), otherwise as neon."""

    def __init__(self, b, flavour, spec):
        self.b, self.flavour = b, flavour
        self.signed = flavour in ("avx2", "neon", "i8mm") and spec.offset == 128
        if flavour == "vnni":
            self.dpb = _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32] * 3)
            self.dpw = _decl(b.module, "llvm.x86.avx512.vpdpwssd.512", V16I32, [V16I32] * 3)

    def _halves(self, v, n):
        b = self.b
        return [b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n // 2), list(range(h * n // 2, (h + 1) * n // 2))))
                for h in range(2)]

    def _join(self, lo, hi):
        return self.b.shuffle_vector(lo, hi, ir.Constant(V16I32, list(range(16))))

    def weights(self, w):
        """A loaded <16 x i32> weight vector, made ready for ``dot`` (once per load, shared by the tokens)."""
        if self.flavour == "vnni":
            return w
        b = self.b
        if self.flavour == "neon":
            v = b.bitcast(w, ir.VectorType(I8, 64))
            if self.signed:
                v = b.xor(v, _splat(I8, 64, 0x80))
            return [b.shuffle_vector(v, v, ir.Constant(V16I32, list(range(16 * q, 16 * q + 16)))) for q in range(4)]
        halves = self._halves(b.bitcast(w, ir.VectorType(I8, 64)), 64)
        if not self.signed:
            return halves
        s = [b.xor(h, _splat(I8, 32, 0x80)) for h in halves]
        ab = _decl(b.module, "llvm.abs.v32i8", V32I8, [V32I8, ir.IntType(1)])
        return [(b.call(ab, [x, ir.Constant(ir.IntType(1), 0)]), x) for x in s]

    def row_pairs(self, lo, hi):
        """i8mm: two loaded <16 x i32> weight vectors (4-element groups q and q + 1 of 16 rows) -> 8
        <16 x i8>, rows 2m and 2m + 1's 8 bytes each (``smmla``'s 2 x 8 operand; a zip of 32-bit lanes)."""
        b = self.b
        out = []
        for m in range(8):
            v = b.bitcast(b.shuffle_vector(lo, hi, ir.Constant(V4I32, [2 * m, 16 + 2 * m, 2 * m + 1, 17 + 2 * m])),
                          V16I8)
            out.append(b.xor(v, _splat(I8, 16, 0x80)) if self.signed else v)
        return out

    def acts(self, x4):
        """4 activation bytes (an i32) broadcast to every row."""
        if self.flavour == "vnni":
            return _splat16(self.b, x4)
        b = self.b
        if self.flavour == "neon":
            v = b.insert_element(ir.Constant(V4I32, None), x4, ir.Constant(I32, 0))
            return b.bitcast(b.shuffle_vector(v, v, ir.Constant(V4I32, [0] * 4)), V16I8)
        v = b.insert_element(ir.Constant(V8I32, None), x4, ir.Constant(I32, 0))
        return b.bitcast(b.shuffle_vector(v, v, ir.Constant(V8I32, [0] * 8)), V32I8)

    def dot(self, acc, w, x):
        """acc + per row, the dot of its 4 weight bytes with the 4 activation bytes."""
        b = self.b
        if self.flavour == "vnni":
            return b.call(self.dpb, [acc, w, x])
        if self.flavour == "neon":
            accs = [b.shuffle_vector(acc, acc, ir.Constant(V4I32, list(range(4 * q, 4 * q + 4)))) for q in range(4)]
            parts = [_sdot(b, a, wq, x) for a, wq in zip(accs, w)]
            lo, hi = (b.shuffle_vector(parts[2 * h], parts[2 * h + 1], ir.Constant(V8I32, list(range(8)))) for h in range(2))
            return self._join(lo, hi)
        if self.signed:
            sign = _decl(b.module, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8])
            parts = [_pairs_to_lanes(b, _maddubs(b, a, b.call(sign, [x, sv]))) for a, sv in w]
        else:
            parts = [_pairs_to_lanes(b, _maddubs(b, h, x)) for h in w]
        return b.add(acc, self._join(*parts))

    def madd_pairs(self, acc, m, x2):
        """acc + per row, its int16 pair ``m`` times the int16 pair ``x2`` (an i32), summed (vpdpwssd)."""
        b = self.b
        if self.flavour == "vnni":
            return b.call(self.dpw, [acc, m, _splat16(b, x2)])
        if self.flavour in ("neon", "i8mm"):  # sext to int32, multiply, add each lane's two products
            v32 = ir.VectorType(I32, 32)
            p = b.mul(b.sext(b.bitcast(m, ir.VectorType(I16, 32)), v32),
                      b.sext(b.bitcast(_splat16(b, x2), ir.VectorType(I16, 32)), v32))
            ev, od = (b.shuffle_vector(p, p, ir.Constant(V16I32, list(range(e, 32, 2)))) for e in range(2))
            return b.add(acc, b.add(ev, od))
        xv = b.bitcast(self.acts(x2), V16I16)
        parts = [_madd16(b, b.bitcast(h, V16I16), xv) for h in self._halves(m, 16)]
        return b.add(acc, self._join(*parts))


def _group(b, spec, cols, i, gi, toks, ngr, wsb, xsb, xcp, ops):
    """The integer dots of group ``gi`` (an i64 value) of super-block ``i``: per sub-tile j (``wsb[j]``)
    and token c, <16 x i32> of sum(u * x) (minus offset * sum(x) where the type has an offset). Each
    activation broadcast serves every sub-tile."""
    g, ng = spec.g, spec.ng
    if spec.offset and not ops.signed:
        gidx = [b.add(b.mul(t, ngr), b.add(_mul(b, i, ng), gi)) for t in toks]
        init = [_splat16(b, _at(b, xcp, _mul(b, gx, 4), I32)) for gx in gidx]
    else:
        init = [ir.Constant(V16I32, None)] * cols
    wg = [b.gep(w, [_mul(b, gi, g * LANES)]) for w in wsb]
    xg = [b.gep(x, [_mul(b, gi, g)]) for x in xsb]
    if ops.flavour == "i8mm":
        return _group_mm(b, g, cols, wg, xg, init, ops)
    iacc = [list(init) for _ in wsb]
    for q in range(g // 4):
        wv = [ops.weights(_at(b, w, q * 64, V16I32)) for w in wg]
        for c in range(cols):
            xv = ops.acts(_at(b, xg[c], 4 * q, I32))
            for j, w in enumerate(wv):
                iacc[j][c] = ops.dot(iacc[j][c], w, xv)
    return iacc


def _group_mm(b, g, cols, wg, xg, init, ops):
    """``_group`` on AArch64's ``smmla`` (FEAT_I8MM; ggml's ``vmmlaq_s32``): per 8 elements, each pair of
    rows (8 bytes each, ``row_pairs``) times each pair of tokens (their 8 activation bytes) gives the
    2 x 2 int32 products [r.c, r.c', r'.c, r'.c'], twice sdot's work per instruction. The group's
    <4 x i32> accumulators are then sorted back into one <16 x i32> per token (lane = row) and added to
    ``init``: the same integer sums as the other flavours, so the same results."""
    mm = _decl(b.module, "llvm.aarch64.neon.smmla.v4i32.v16i8", V4I32, [V4I32, V16I8, V16I8])
    v2 = ir.VectorType(I64, 2)
    npair = cols // 2
    acc = [[[ir.Constant(V4I32, None)] * 8 for _ in range(npair)] for _ in wg]
    for q in range(g // 8):
        xs = []
        for p in range(npair):
            v = b.insert_element(ir.Constant(v2, None), _at(b, xg[2 * p], 8 * q, I64), ir.Constant(I32, 0))
            v = b.insert_element(v, _at(b, xg[2 * p + 1], 8 * q, I64), ir.Constant(I32, 1))
            xs.append(b.bitcast(v, V16I8))
        for j, w in enumerate(wg):
            rp = ops.row_pairs(_at(b, w, 128 * q, V16I32), _at(b, w, 128 * q + 64, V16I32))
            for p, xv in enumerate(xs):
                acc[j][p] = [b.call(mm, [a, r, xv]) for a, r in zip(acc[j][p], rp)]
    out = []
    for j in range(len(wg)):
        row = []
        for p in range(npair):
            a = acc[j][p]
            cat = [b.shuffle_vector(a[2 * m], a[2 * m + 1], ir.Constant(V8I32, list(range(8)))) for m in range(4)]
            lo, hi = (b.shuffle_vector(cat[2 * h], cat[2 * h + 1], ir.Constant(V16I32, list(range(16)))) for h in range(2))
            for e in range(2):  # token 2p: lanes 0, 2 of each pair's product; token 2p + 1: lanes 1, 3
                tok = b.shuffle_vector(lo, hi, ir.Constant(V16I32, list(range(e, 32, 2))))
                row.append(b.add(init[2 * p + e], tok))
        out.append(row)
    return out


def _groups(b, spec, cols, i, toks, ngr, wsb, xsb, sps, xcp, ops):
    """Per sub-tile and token, the scale-weighted sum over super-block ``i``'s groups: <16 x i32> (one
    group, or integer scales of groups of 32) or <16 x float> (per-16 scales: float products; ``vpmulld``
    there measured 20 % slower). The groups run as a loop, not unrolled: unrolled, LLVM interleaved the
    groups' accumulators and spilled them (IQ4_XS's tile 1.5x slower than Q4_K's)."""
    ng, g = spec.ng, spec.g
    if ng == 1:
        return _group(b, spec, cols, i, ir.Constant(I64, 0), toks, ngr, wsb, xsb, xcp, ops)
    vt = V16F32 if g == 16 else V16I32
    slots = [[cgutils.alloca_once_value(b, ir.Constant(vt, None)) for _ in range(cols)] for _ in wsb]
    with cgutils.for_range(b, ir.Constant(I64, ng)) as loop:
        gi = loop.index
        iacc = _group(b, spec, cols, i, gi, toks, ngr, wsb, xsb, xcp, ops)
        for j, sp in enumerate(sps):
            s = _at(b, sp, b.add(_mul(b, i, 4 * ng * LANES), _mul(b, gi, 4 * LANES)), V16I32)
            if g == 16:
                sf = b.sitofp(s, V16F32)
                for c in range(cols):
                    b.store(b.fadd(b.load(slots[j][c]), b.fmul(b.sitofp(iacc[j][c], V16F32), sf, flags=_FM),
                                   flags=_FM), slots[j][c])
            else:
                for c in range(cols):
                    b.store(b.add(b.load(slots[j][c]), b.mul(iacc[j][c], s)), slots[j][c])
    return [[b.load(x) for x in row] for row in slots]


def _micro(name: str, spec: Spec, cols: int, ns: int = 1, flavour: str = "vnni"):
    """``mk(wu, sc, mn, dd, dm, xq, dx, xc, xm, out, t0, ct, r0, nr)``: out[t0 + c, r0 + l] for c < ct,
    l < nr = ``ns`` consecutive 16-row sub-tiles (wu...; all ns present, the last may be partial) times
    the activations of tokens t0 .. t0 + cols - 1 (planar: xq int8 (n, K), dx float32 (n, K/qk), xc
    int32 (n, K/g) = -offset * group sums, xm the mins' operand: int16 (n, K/g) group sums or float32
    (n, K/32) Q8_1 s). Two sub-tiles x 4 tokens load 2 weight vectors and 4 broadcasts per 8
    ``vpdpbusd`` (one x 8: 1 and 8 per 8) -- the same accumulators, the same per-output operations."""
    qk, g, ng = spec.qk, spec.g, spec.ng

    def impl(typingctx, wu, sc, mn, dd, dm, xq, dx, xc, xm, out, t0, ct, r0, nr):
        sig = types.void(wu, sc, mn, dd, dm, xq, dx, xc, xm, out, t0, ct, r0, nr)

        def codegen(context, builder, signature, args):
            ta = signature.args
            b = builder
            up, sp, mp, dp, ep, xp, xdp, xcp, xmp, op = (_ptr(context, b, ta[i], args[i]) for i in range(10))
            t0_, ct_, r0_, nr_ = (_i64(b, context.cast(b, args[i], ta[i], types.intp)) for i in range(10, 14))
            kdim = _i64(b, cgutils.unpack_tuple(b, context.make_array(ta[5])(context, b, args[5]).shape)[1])
            n_out = _i64(b, cgutils.unpack_tuple(b, context.make_array(ta[9])(context, b, args[9]).shape)[1])
            nsb = b.sdiv(kdim, ir.Constant(I64, qk))
            ngr = b.sdiv(kdim, ir.Constant(I64, g))  # groups per token row
            # per sub-tile j: its parts at j times a sub-tile's bytes (layout above)
            sub = lambda p, per: [b.gep(p, [b.mul(b.mul(nsb, ir.Constant(I64, per)), ir.Constant(I64, j))])
                                  for j in range(ns)]  # noqa: E731
            ups, sps, mps = sub(up, qk * LANES), sub(sp, 4 * ng * LANES), sub(mp, 2 * ng * LANES)
            dps, eps = sub(dp, 4 * LANES), sub(ep, 4 * LANES)
            ops = _Ops(b, flavour, spec)
            toks = [b.add(t0_, ir.Constant(I64, c)) for c in range(cols)]
            xrow = [b.gep(xp, [b.mul(t, kdim)]) for t in toks]
            facc = [[cgutils.alloca_once_value(b, ir.Constant(V16F32, None)) for _ in range(cols)] for _ in range(ns)]
            zero = ir.Constant(V16I32, None)
            with cgutils.for_range(b, nsb) as loop:
                i = loop.index
                wsb = [b.gep(u, [_mul(b, i, qk * LANES)]) for u in ups]
                xsb = [b.gep(xr, [_mul(b, i, qk)]) for xr in xrow]
                dxs = [_at(b, xdp, b.mul(b.add(b.mul(t, nsb), i), ir.Constant(I64, 4)), F32T) for t in toks]
                sacc = _groups(b, spec, cols, i, toks, ngr, wsb, xsb, sps, xcp, ops)
                for j in range(ns):
                    dv = _at(b, dps[j], _mul(b, i, 4 * LANES), V16F32)
                    acc = [b.load(f) for f in facc[j]]
                    for c in range(cols):
                        sv = b.fmul(dv, _splat16(b, dxs[c]), flags=_FM)
                        sa = sacc[j][c] if sacc[j][c].type == V16F32 else b.sitofp(sacc[j][c], V16F32)
                        acc[c] = b.fadd(acc[c], b.fmul(sa, sv, flags=_FM), flags=_FM)
                    if spec.mins == "int":
                        macc = [zero] * cols
                        for p in range(ng // 2):
                            mv = _at(b, mps[j], b.add(_mul(b, i, 2 * ng * LANES), ir.Constant(I64, 4 * LANES * p)),
                                     V16I32)
                            for c in range(cols):
                                gx = b.add(b.mul(toks[c], ngr), b.add(_mul(b, i, ng), ir.Constant(I64, 2 * p)))
                                macc[c] = ops.madd_pairs(macc[c], mv, _at(b, xmp, _mul(b, gx, 2), I32))
                        mdv = _at(b, eps[j], _mul(b, i, 4 * LANES), V16F32)
                        for c in range(cols):
                            sv = b.fmul(mdv, _splat16(b, dxs[c]), flags=_FM)
                            acc[c] = b.fadd(acc[c], b.fmul(b.sitofp(macc[c], V16F32), sv, flags=_FM), flags=_FM)
                    elif spec.mins == "float":
                        mv = _at(b, eps[j], _mul(b, i, 4 * LANES), V16F32)
                        for c in range(cols):
                            s = _at(b, xmp, b.mul(b.add(b.mul(toks[c], nsb), i), ir.Constant(I64, 4)), F32T)
                            acc[c] = b.fadd(acc[c], b.fmul(mv, _splat16(b, s), flags=_FM), flags=_FM)
                    for c in range(cols):
                        b.store(acc[c], facc[j][c])
            store_tile(b, op, facc, toks, ct_, r0_, nr_, n_out)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"gemm_micro_{name}_{cols}_{ns}_{flavour}"
    return intrinsic(impl)


def store_tile(b, op, facc, toks, ct, r0, nr, n_out):
    """The micro-kernel's outputs: out[toks[c], r0 + 16 j + l] = lane l of ``facc[j][c]`` (allocas of
    <16 x float>) for c < ct and 16 j + l < nr (a partial last sub-tile lane by lane); ``op`` is out's
    i8*, ``n_out`` its row length (i64 values)."""
    for j in range(len(facc)):
        nrj = b.sub(nr, ir.Constant(I64, LANES * j))
        full = b.icmp_signed(">=", nrj, ir.Constant(I64, LANES))
        rj = b.add(r0, ir.Constant(I64, LANES * j))
        for c in range(len(facc[j])):
            with b.if_then(b.icmp_signed("<", ir.Constant(I64, c), ct)):
                dst = b.gep(op, [b.mul(b.add(b.mul(toks[c], n_out), rj), ir.Constant(I64, 4))])
                v = b.load(facc[j][c])
                with b.if_else(full) as (then, other):
                    with then:
                        b.store(v, b.bitcast(dst, V16F32.as_pointer()), align=4)
                    with other:
                        with cgutils.for_range(b, nrj) as lp:
                            el = b.extract_element(v, b.trunc(lp.index, I32))
                            _put(b, dst, b.mul(lp.index, ir.Constant(I64, 4)), el)


#: a tile's C signature (``jit.call_addr``): the product's table (``P_*``), the tile's index, rows per
#: tile, and the addresses of the tile's scratch (unpacked bytes, scales, mins, d, -dmin or m); two unused
TILE_SIG = types.void(*([types.int64] * 10))
#: the product's table, int64 fields by index: the weights' address, rows, bytes a row, row stride; the
#: activations' quants (rows padded to COLS, K), their scales, group sums and mins operand (address, items);
#: the output's address and tokens
(P_W, P_NOUT, P_RB, P_STRIDE, P_XQ, P_NPAD, P_K, P_DX, P_NDX, P_XC, P_NXC, P_XM, P_NXM, P_OUT, P_NTOK,
 N_P) = range(16)


def gemm_tile(pt, tile, mr, wup, scp, mnp, ddp, dmp, _u0, _u1):
    """Tile ``tile`` of the product described by the table at ``pt``: weight rows tile * mr .. + mr,
    unpacked once into the scratch (UNPACK, 16 rows at a time) and then multiplied with every group of
    COLS tokens (MK2 on pairs of 16-row sub-tiles, MK on an odd last one). A ``cfunc`` of TILE_SIG per
    type and flavour, which ``gemm_body`` -- built once for every type -- calls per tile."""
    p = view_i64(pt, N_P)
    n_out, kdim, n_tok = p[P_NOUT], p[P_K], p[P_NTOK]
    w = view_u8_ro(p[P_W], n_out * p[P_STRIDE]).reshape((n_out, p[P_STRIDE]))[:, :p[P_RB]]
    xq = view_i8(p[P_XQ], p[P_NPAD] * kdim).reshape((p[P_NPAD], kdim))
    dx, xc, xm = view_f32(p[P_DX], p[P_NDX]), view_i32(p[P_XC], p[P_NXC]), XMV(p[P_XM], p[P_NXM])  # noqa: F821
    out = view_f32(p[P_OUT], n_tok * n_out).reshape((n_tok, n_out))
    nsb = kdim // QK  # noqa: F821
    sub_u = LANES * kdim  # noqa: F821
    sub_s = nsb * NG * LANES  # noqa: F821
    sub_d = nsb * LANES  # noqa: F821
    r0 = tile * mr
    r1 = min(r0 + mr, n_out)
    nsub = (r1 - r0 + LANES - 1) // LANES  # noqa: F821
    wu = view_u8(wup, nsub * sub_u)
    sc = view_i32(scp, nsub * sub_s)
    mn = view_i16(mnp, nsub * sub_s)
    dd = view_f32(ddp, nsub * sub_d)
    dm = view_f32(dmp, nsub * sub_d)
    for s in range(nsub):
        UNPACK(w, r0 + s * LANES, min(LANES, r1 - r0 - s * LANES), wu[s * sub_u:(s + 1) * sub_u],  # noqa: F821
               sc[s * sub_s:(s + 1) * sub_s], mn[s * sub_s:(s + 1) * sub_s], dd[s * sub_d:(s + 1) * sub_d],
               dm[s * sub_d:(s + 1) * sub_d])
    for t0 in range(0, n_tok, COLS):  # noqa: F821
        ct = min(COLS, n_tok - t0)  # noqa: F821
        s = 0
        while s + 1 < nsub:  # pairs of sub-tiles, COLS / 2 tokens at a time
            for h in range(0, ct, COLS // 2):  # noqa: F821
                MK2(wu[s * sub_u:(s + 2) * sub_u], sc[s * sub_s:(s + 2) * sub_s], mn[s * sub_s:(s + 2) * sub_s],  # noqa: F821
                    dd[s * sub_d:(s + 2) * sub_d], dm[s * sub_d:(s + 2) * sub_d], xq, dx, xc, xm, out,
                    t0 + h, min(COLS // 2, ct - h), r0 + s * LANES, min(2 * LANES, r1 - r0 - s * LANES))  # noqa: F821
            s += 2
        if s < nsub:
            MK(wu[s * sub_u:(s + 1) * sub_u], sc[s * sub_s:(s + 1) * sub_s], mn[s * sub_s:(s + 1) * sub_s],  # noqa: F821
               dd[s * sub_d:(s + 1) * sub_d], dm[s * sub_d:(s + 1) * sub_d], xq, dx, xc, xm, out,
               t0, ct, r0 + s * LANES, min(LANES, r1 - r0 - s * LANES))  # noqa: F821


def gemm_body(tile, qk, ng, w, xq, dx, xc, xm, out, mr):
    """out (n_tok, n_out) = w . x for quantized activations (xq padded to a multiple of COLS rows) by the
    type's tile at address ``tile`` (``gemm_tile``; ``qk``, ``ng``: its blocks' elements and scaled
    groups, which size the scratch): prange over tiles of ``mr`` weight rows (a multiple of 16), each
    with its own scratch. One build for every type and flavour (per argument types): a prange build is
    most of a GEMM's compiling (~4 of ~6.5 CPU-s each), once per type and flavour it was 46 builds in
    the test suite."""
    n_out = w.shape[0]
    kdim = xq.shape[1]
    pt = np.empty(N_P, np.int64)
    pt[P_W], pt[P_NOUT], pt[P_RB], pt[P_STRIDE] = addr_of(w), n_out, w.shape[1], w.strides[0]
    pt[P_XQ], pt[P_NPAD], pt[P_K] = addr_of(xq), xq.shape[0], kdim
    pt[P_DX], pt[P_NDX], pt[P_XC], pt[P_NXC], pt[P_XM], pt[P_NXM] = addr_of(dx), dx.size, addr_of(xc), xc.size, \
        addr_of(xm), xm.size
    pt[P_OUT], pt[P_NTOK] = addr_of(out), out.shape[0]
    nsb = kdim // qk
    n_tiles = (n_out + mr - 1) // mr
    for i in prange(n_tiles):
        r0 = i * mr
        nsub = (min(r0 + mr, n_out) - r0 + LANES - 1) // LANES
        wu = np.empty(nsub * LANES * kdim, np.uint8)
        sc = np.empty(nsub * nsb * ng * LANES, np.int32)
        mn = np.empty(nsub * nsb * ng * LANES, np.int16)
        dd = np.empty(nsub * nsb * LANES, np.float32)
        dm = np.empty(nsub * nsb * LANES, np.float32)
        call_addr(tile, addr_of(pt), i, mr, addr_of(wu), addr_of(sc), addr_of(mn), addr_of(dd), addr_of(dm), 0, 0)


_KERNELS: dict = {}


def _spec(t) -> Spec:
    """Type ``t``'s GEMM entry (its record's column, kernels/cpu_traits.py, which is built from this module)."""
    from quantkit.kernels.cpu_traits import cpu_traits

    spec = cpu_traits(t).gemm
    if spec is None:
        raise ValueError(f"no integer GEMM for {T(t).name}")
    return spec


#: tokens per micro-kernel call per flavour: 16 ymm registers hold half the accumulators 32 zmm do
#: (NEON: 32 q registers, a <16 x i32> accumulator takes 4: 2 sub-tiles x 2 tokens = 16 of them)
#: (i8mm: 4 tokens as 2 pairs; 16 rows are 8 row pairs, 16 <4 x i32> accumulators as for neon)
FLAVOUR_COLS = {"vnni": COLS, "avx2": COLS // 2, "neon": COLS // 2, "i8mm": COLS // 2}
#: the chunk loaders' flavour (ir.py) per GEMM flavour, where they differ
_LOAD_FLAVOUR = {"i8mm": "neon"}


def gemm_tile_kernel(wtype, flavour: str = "vnni", cols: int | None = None, cache: bool = True):
    """The C-callable ``gemm_tile`` of ``wtype`` (a type whose record has a GEMM entry,
    kernels/cpu_traits.py) for an ``ir.gemm_flavour`` (``TILE_SIG``: what ``gemm_body`` calls);
    ``cache=False`` builds it apart from the disk cache (a test reads its machine code)."""
    t = T(wtype)
    cols = cols or FLAVOUR_COLS[flavour]
    key = (t, cols, flavour, cache)
    if key not in _KERNELS:
        spec = _spec(t)
        ts = type_info(t.name).type_size
        _KERNELS[key] = specialize(
            gemm_tile, f"{t.name}_{cols}_{flavour}", fast=True, cfunc=TILE_SIG, cache=cache,
            UNPACK=_unpack_tile(t.name, spec, ts, _LOAD_FLAVOUR.get(flavour, flavour)),
            MK=_micro(t.name, spec, cols, 1, flavour), MK2=_micro(t.name, spec, cols // 2, 2, flavour),
            XMV=view_f32 if spec.mins == "float" else view_i16, QK=spec.qk, NG=spec.ng, LANES=LANES, COLS=cols)
    return _KERNELS[key]


def gemm_kernel(wtype, flavour: str = "vnni", cols: int | None = None):
    """``gemm(w, xq, dx, xc, xm, out, mr)`` of ``wtype`` for an ``ir.gemm_flavour``: ``gemm_body`` bound
    to the type's tile (``gemm_tile_kernel``)."""
    key = ("bound", T(wtype), cols or FLAVOUR_COLS[flavour], flavour)
    if key not in _KERNELS:
        tile, spec = gemm_tile_kernel(wtype, flavour, cols), _spec(wtype)
        _KERNELS[key] = functools.partial(specialize(gemm_body, "all", parallel=True, fast=True), tile.address,
                                          spec.qk, spec.ng)
    return _KERNELS[key]


# -- activations -----------------------------------------------------------------------------------

def quantized_activations(x: np.ndarray, kind: str):
    """x float32 (n, K) -> planar (xq, xd, xs) of ``kind``, the same bytes as ``quantize_activations``,
    with rows padded with zeros to a multiple of COLS; prange over tokens."""
    n, kdim = x.shape
    n_pad = -(-n // COLS) * COLS
    qs, d, s = empty_activations(kind, n_pad, kdim)
    ACT_QUANTIZER_ROWS[kind](x, qs[:n], d[:n], s[:n])
    if n_pad > n:
        qs[n:], d[n:], s[n:] = 0, 0, 0
    return qs, d, s


def gemm_operands(t, x: np.ndarray, cache: dict):
    """The activation operands of ``gemm_kernel(t)``: (xq, dx, xc, xm) for x (n, K); ``cache`` (a dict
    shared by the products of one x) keeps the quantized forms, so Q/K/V or gate/up quantize once."""
    spec = _spec(t)
    key = ("gemm", spec.act)
    if key not in cache:
        cache[key] = quantized_activations(x, spec.act)
    qs, d, s = cache[key]
    okey = ("gemm", spec.act, spec.g, spec.offset, spec.mins)
    if okey not in cache:
        if spec.act == "Q8_1":
            gs = None
        elif spec.act == "Q8_0" or spec.g == 16:  # Q8_0's per-32 sums, Q8_K's bsums
            gs = s
        else:  # Q8_K bsums -> per-32 sums
            gs = s[:, 0::2] + s[:, 1::2]
        xc = (gs * np.int32(-spec.offset)) if spec.offset else _DUMMY_I32
        if spec.mins == "int":
            xm = np.ascontiguousarray(gs, dtype=np.int16)
        elif spec.mins == "float":
            xm = s
        else:
            xm = _DUMMY_I16
        cache[okey] = (np.ascontiguousarray(xc), xm)
    xc, xm = cache[okey]
    return qs, d, xc, xm


_DUMMY_I32 = np.zeros((1, 1), np.int32)
_DUMMY_I16 = np.zeros((1, 1), np.int16)
#: bytes of unpacked weights per tile (one thread's working set beside COLS activation rows)
TILE_BYTES = 256 << 10


def tile_rows(n_out: int, kdim: int, threads: int) -> int:
    """Rows per prange tile: a multiple of 32 (the micro-kernel's pairs of 16-row sub-tiles) whose
    unpacked bytes are about TILE_BYTES (at least 32 rows: 8B's 14336-wide ffn_down), and at least two
    tiles per thread when the matrix allows."""
    unit = 2 * LANES
    mr = unit * max(1, TILE_BYTES // (unit * kdim))
    per = -(-n_out // (2 * threads))
    return max(unit, min(mr, -(-per // unit) * unit))


def gemm(w: np.ndarray, t, x: np.ndarray, out: np.ndarray, cache: dict, threads: int,
         flavour: str = "vnni") -> np.ndarray:
    """out = x @ dequantize(w).T on integer dots (w uint8 (n_out, row_bytes) of a type with a GEMM entry)."""
    xq, dx, xc, xm = gemm_operands(t, x, cache)
    # weights read-only, as the file's map gives them: one build whoever calls (jit.frozen)
    gemm_kernel(t, flavour)(frozen(w), xq, dx, xc, xm, out, tile_rows(w.shape[0], x.shape[1], threads))
    return out
