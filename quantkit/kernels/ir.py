"""LLVM-IR building blocks for the integer dot products, emitted with ``numba.extending.intrinsic``.

Plain numba types integer arithmetic as int64, so an int8 x int8 loop never becomes ``vpdpbusd``
(docs/kernels.md). Here the inner part of each block dot -- unpacking
the weight bits to 32 unsigned bytes per chunk and multiplying them with 32 int8 activations -- is
written as LLVM IR. Everything else (fp16 scales, mins through the activation sums, the float
accumulate) stays in ordinary numba code in ``vecdot.py``.

Every weight chunk is turned into *unsigned* bytes ``u`` (0..255); a signed format is written as
``u - offset`` (Q4_0: nibble - 8, Q8_0: (q ^ 0x80) - 128, Q6_K: q - 32, ...), and the caller
subtracts ``offset * sum(x)`` using the per-block activation sums (Q8_K's ``bsums``, our Q8_0/Q8_1
block sums). So every dot is u8 x s8, which is exactly ``vpdpbusd``.

Variants (the same numba bodies are compiled against either):

* ``vnni``    -- ``llvm.x86.avx512.vpdpbusd.256`` (AVX512-VNNI+VL, or AVX-VNNI: LLVM picks the VEX form)
* ``generic`` -- target-independent IR: ``mul(zext u, sext x)`` summed to 8 lanes of 4 bytes (LLVM
  turns this into vpdpbusd/vpmaddubsw where it can, and into plain SIMD elsewhere)

A chunk dot produces 8 int32 lanes, lane i holding bytes 4i..4i+3; so lanes 0-3 are the first 16
elements and 4-7 the last 16, which is how per-16 scales (Q2_K, Q3_K, Q6_K) are applied before the
single horizontal reduction per (super-)block.
"""

from __future__ import annotations

import os

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit import config
from quantkit.formats.ggml_types import KVALUES_IQ4NL, type_info
from quantkit.jit import IS_X86, host_features
from quantkit.jit import byte_ptr as _byte_ptr
from quantkit.jit import source_digest
from quantkit.jit import ld_f32, ld_u16, ld_u32  # noqa: F401  (re-exported: the kernels' scalar loads)
from quantkit.quants.common import ld_bf16, ld_f16  # noqa: F401

# -- host features ---------------------------------------------------------------------------------

_FEATURES = host_features()
HAS_VNNI = IS_X86 and (("avx512vnni" in _FEATURES and "avx512vl" in _FEATURES) or "avxvnni" in _FEATURES)
#: 512-bit vpdpbusd (two 32-element blocks per instruction)
HAS_VNNI512 = IS_X86 and {"avx512f", "avx512bw", "avx512vnni"} <= _FEATURES
#: hardware half -> float (``fpext half``): F16C on x86; native elsewhere
HAS_F16 = (not IS_X86) or "f16c" in _FEATURES
#: BMI2's pdep (the lattice types' grid indices, kernels/lowbit.py)
HAS_BMI2 = IS_X86 and "bmi2" in _FEATURES
#: GFNI's vgf2p8affineqb (a byte's bits moved in one instruction: the x8 Q6_K unpack)
HAS_GFNI = IS_X86 and "gfni" in _FEATURES

VARIANTS = ("vnni", "generic", "plain")
#: opt-in (QUANTKIT_512=1): 32-element blocks two at a time with a 512-bit vpdpbusd where the CPU has
#: AVX512-VNNI. Off by default: on the development Xeon it measured 15-25% slower per core than the
#: 256-bit loop (zmm clock licence / extra shuffles); it may pay on CPUs without that penalty (Zen 4).
PAIRS_512 = config.pairs_512()
#: software prefetch distance (bytes ahead of the block being read) in the row dots; 0 turns it off
#: (``QUANTKIT_PREFETCH=n``). A decode step streams ~100 MB of weights from DRAM; the hardware
#: prefetchers alone left the loads exposed (SmolLM2 Q4_1, 1 thread: 20.5 -> 14.5 CPU-ms per token
#: with 2048; 1024 and 4096 were slower, and so were prefetcht1 and prefetchnta).
PREFETCH = config.prefetch_distance()
#: the same for the 8-row interleaved (x8) loops, whose one stream carries 8 rows (``QUANTKIT_X8_PREFETCH``)
X8_PREFETCH = config.x8_prefetch_distance()


def _digest() -> str:
    """A digest of the sources the built kernels inline (this package, the codecs' row decoders in quants/,
    the type table, jit.py). It goes into the built kernels' names: numba's on-disk cache only watches the
    file a function is defined in, so without it an edit to a callee in another file would leave stale
    machine code."""
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.dirname(here)
    files = [os.path.join(d, f) for d in (here, os.path.join(pkg, "quants"))
             for f in sorted(os.listdir(d)) if f.endswith(".py")]
    files += [os.path.join(pkg, "formats", "ggml_types.py"), os.path.join(pkg, "jit.py")]
    return source_digest(*files)


IR_DIGEST = _digest() + ("_512" if PAIRS_512 else "") + (f"_pf{PREFETCH}" if PREFETCH != 2048 else "") + (
    f"_xpf{X8_PREFETCH}" if X8_PREFETCH != 4096 else "") + ("" if config.k512() else "_k256")


def default_variant() -> str:
    """The kernel variant in force: ``QUANTKIT_KERNELS=vnni|generic|plain`` overrides;
    ``QUANTKIT_NO_VNNI=1`` forces ``generic``; otherwise ``vnni`` where the CPU has it."""
    v = config.kernels_variant()
    if v in VARIANTS:
        if v == "vnni" and not HAS_VNNI:
            return "generic"
        return v
    if config.no_vnni():
        return "generic"
    return "vnni" if HAS_VNNI else "generic"


# -- IR helpers ------------------------------------------------------------------------------------

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
V8I32 = ir.VectorType(I32, 8)
V32I8 = ir.VectorType(I8, 32)
V16I8 = ir.VectorType(I8, 16)
V32I32 = ir.VectorType(I32, 32)


def _load(builder, p, off, vty):
    q = builder.gep(p, [ir.Constant(I64, off)]) if off else p
    return builder.load(builder.bitcast(q, vty.as_pointer()), align=1)


def _splat(ty, n, c):
    return ir.Constant(ir.VectorType(ty, n), [c] * n)


def _decl(module, name, ret, args):
    return cgutils.get_or_insert_function(module, ir.FunctionType(ret, args), name)


def _concat16(builder, a, b):
    return builder.shuffle_vector(a, b, ir.Constant(V32I32, list(range(32))))


def _nibbles16(builder, p, off):
    """16 bytes -> 32 unsigned values: low nibbles first, then high nibbles (ggml's 32-blocks)."""
    b = _load(builder, p, off, V16I8)
    lo = builder.and_(b, _splat(I8, 16, 15))
    hi = builder.lshr(b, _splat(I8, 16, 4))
    return _concat16(builder, lo, hi)


def _bits_to_bytes(builder, word_i32, shift):
    """32-bit mask -> <32 x i8> with (bit j) << shift in element j."""
    m = builder.bitcast(word_i32, ir.VectorType(ir.IntType(1), 32))
    z = builder.zext(m, V32I8)
    return builder.shl(z, _splat(I8, 32, shift)) if shift else z


def _lut16(builder, variant, idx, table):
    """Look up 32 nibble indices in a 16-entry byte table."""
    if variant == "vnni":  # AVX2 pshufb works within 128-bit lanes: the table is repeated
        fn = _decl(builder.module, "llvm.x86.avx2.pshuf.b", V32I8, [V32I8, V32I8])
        return builder.call(fn, [ir.Constant(V32I8, list(table) * 2), idx])
    # portable: a tree of selects on the index bits
    level = [_splat(I8, 32, t) for t in table]
    bit = 1
    while len(level) > 1:
        sel = builder.icmp_unsigned("!=", builder.and_(idx, _splat(I8, 32, bit)), _splat(I8, 32, 0))
        level = [builder.select(sel, level[i + 1], level[i]) for i in range(0, len(level), 2)]
        bit <<= 1
    return level[0]


def _dot(builder, variant, acc, u, x):
    """acc (<8 x i32> or None) + per-4-byte-lane sums of u8 u * s8 x."""
    if variant == "vnni":
        fn = _decl(builder.module, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, V8I32, V8I32])
        a = acc if acc is not None else ir.Constant(V8I32, None)
        return builder.call(fn, [a, builder.bitcast(u, V8I32), builder.bitcast(x, V8I32)])
    m = builder.mul(builder.zext(u, V32I32), builder.sext(x, V32I32))
    parts = [builder.shuffle_vector(m, m, ir.Constant(V8I32, [4 * i + j for i in range(8)])) for j in range(4)]
    s = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))
    return s if acc is None else builder.add(acc, s)


def _reduce(builder, v):
    fn = _decl(builder.module, "llvm.vector.reduce.add.v8i32", I32, [V8I32])
    return builder.call(fn, [v])


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

F32T = ir.FloatType()
V8F32 = ir.VectorType(F32T, 8)
_FM = ("contract",)  # fma contraction only: no reassociation, so every build sums in the same order


def _f16(builder, p, off):
    """fp16 at byte ``off`` of i8* ``p`` -> float, exact."""
    q = builder.gep(p, [off]) if isinstance(off, ir.Value) else _gep(builder, p, off)
    if HAS_F16:
        return builder.fpext(builder.load(builder.bitcast(q, ir.HalfType().as_pointer()), align=1), F32T)
    # portable: (h & 0x7fff) << 13 reinterpreted, times 2**112, is exact for normals and subnormals
    h = builder.zext(builder.load(builder.bitcast(q, I16.as_pointer()), align=1), I32)
    mag = builder.and_(h, ir.Constant(I32, 0x7FFF))
    f = builder.fmul(builder.bitcast(builder.shl(mag, ir.Constant(I32, 13)), F32T),
                     ir.Constant(F32T, 2.0 ** 112))
    special = builder.icmp_unsigned(">=", mag, ir.Constant(I32, 0x7C00))
    infnan = builder.bitcast(builder.or_(builder.shl(mag, ir.Constant(I32, 13)), ir.Constant(I32, 0x7F800000)), F32T)
    f = builder.select(special, infnan, f)
    sign = builder.shl(builder.and_(h, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    return builder.bitcast(builder.or_(builder.bitcast(f, I32), sign), F32T)


def _gep(builder, p, off):
    return builder.gep(p, [ir.Constant(I64, off)]) if off else p


def _ld(builder, p, off, ty):
    return builder.load(builder.bitcast(_gep(builder, p, off), ty.as_pointer()), align=1)


def _vconst(vals, ty=I32):
    return ir.Constant(ir.VectorType(ty, len(vals)), list(vals))


def _shuf(builder, v, idx):
    return builder.shuffle_vector(v, v, _vconst(idx))


def _fold16(builder, v16):
    """<16 x i32> -> <8 x i32> (lane i + lane i+8): for sums that are reduced later anyway."""
    return builder.add(_shuf(builder, v16, range(8)), _shuf(builder, v16, range(8, 16)))


def _pairs16(builder, v16):
    """<16 x i32> -> <8 x i32> of adjacent pairs (16-element bsums -> 32-element sums)."""
    return builder.add(_shuf(builder, v16, range(0, 16, 2)), _shuf(builder, v16, range(1, 16, 2)))


def _fma_acc(builder, acc, ivec, scale):
    """acc + float(ivec) * scale (ivec <8 x i32>, scale a float)."""
    sv = builder.insert_element(ir.Constant(V8F32, None), scale, ir.Constant(I32, 0))
    sv = builder.shuffle_vector(sv, sv, ir.Constant(V8I32, [0] * 8))
    return builder.fadd(acc, builder.fmul(builder.sitofp(ivec, V8F32), sv, flags=_FM), flags=_FM)


V16I16 = ir.VectorType(I16, 16)
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
    if variant == "vnni" and small:
        n = 8 if per == 32 else 16
        sc16 = builder.trunc(scv, ir.VectorType(I16, n))
        mad = _decl(builder.module, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8])
        dpw = _decl(builder.module, "llvm.x86.avx512.vpdpwssd.256", V8I32, [V8I32, V8I32, V8I32])
        accs = [ir.Constant(V8I32, None)] * NACC
        for k in range(8):
            p16 = builder.call(mad, [chunk(builder, variant, wq, k), _ld(builder, xb, 32 * k, V32I8)])
            mask = [k] * 16 if per == 32 else [2 * k] * 8 + [2 * k + 1] * 8
            s16 = builder.shuffle_vector(sc16, sc16, _vconst(mask))
            accs[k % NACC] = builder.call(dpw, [accs[k % NACC], builder.bitcast(p16, V8I32), builder.bitcast(s16, V8I32)])
        while len(accs) > 1:  # integer sums: the same result in any order
            accs = [builder.add(accs[i], accs[i + 1]) for i in range(0, len(accs), 2)]
        return accs[0]
    acc = ir.Constant(V8I32, None)
    for k in range(8):
        t = _dot(builder, variant, None, chunk(builder, variant, wq, k), _ld(builder, xb, 32 * k, V32I8))
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
        t = _dot(b, k.v, init, chunk(b, k.v, _gep(b, k.wb, q_off), 0), _ld(b, k.xb, 0, V32I8))
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


def _spec(name, ns, emit):
    """(block bytes, elements per block -- the type table's --, activation sums per block, emitter)."""
    t = type_info(name)
    return t.type_size, t.block_size, ns, emit


def _legacy_spec(name, chunk, offset):
    """A 32-element type: its chunk loader reads from the block's first field after the scales (the type
    table's ``qh`` or ``qs``); a type with ``m`` adds Q8_1's min term."""
    t = type_info(name)
    q_off = t.field("qh" if "qh" in t.offsets else "qs")
    return _spec(name, 1, _legacy(t.type_size, q_off, chunk, offset, "m" in t.offsets)[3])


#: type name -> (block bytes, elements per block, activation sums per block, emitter)
ROW_SPECS = {
    "Q8_0": _legacy_spec("Q8_0", _chunk_q8_0, 128),
    "Q4_0": _legacy_spec("Q4_0", _chunk_q4_0, 8),
    "Q4_1": _legacy_spec("Q4_1", _chunk_q4_0, 0),
    "Q5_0": _legacy_spec("Q5_0", _chunk_q5_0, 16),
    "Q5_1": _legacy_spec("Q5_1", _chunk_q5_0, 0),
    "IQ4_NL": _legacy_spec("IQ4_NL", _chunk_iq4_nl, 128),
    "Q2_K": _spec("Q2_K", 16, _emit_q2k),
    "Q3_K": _spec("Q3_K", 16, _emit_offset_k("Q3_K", _q3k_scales, _chunk_q3_k, 2)),
    "Q4_K": _spec("Q4_K", 16, _emit_q4k_like(type_info("Q4_K").field("qs"), _chunk_q4_k)),
    "Q5_K": _spec("Q5_K", 16, _emit_q4k_like(type_info("Q5_K").field("qh"), _chunk_q5_k)),
    "Q6_K": _spec("Q6_K", 16, _emit_offset_k("Q6_K", _q6k_scales, _chunk_q6_k, 5)),
    "IQ4_XS": _spec("IQ4_XS", 16, _emit_iq4xs),
}


def _row_dot(variant, name, nrows=1):
    ts, qk, ns, emit = ROW_SPECS[name]
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


def row_dots(variant: str, nrows: int = 1) -> dict:
    """``{type name: ROW intrinsic}`` for one IR variant ('vnni' or 'generic'). With ``nrows`` > 1 the
    intrinsic dots that many consecutive rows (``wr`` holds them one after another) with the same
    activations and returns a tuple; each row's sum is computed exactly as the 1-row dot's."""
    if variant not in ("vnni", "generic"):
        raise ValueError(f"no IR dots for variant {variant!r}")
    return {name: _row_dot(variant, name, nrows) for name in ROW_SPECS}


# -- prefetch -------------------------------------------------------------------------------------------

@intrinsic
def prefetch(typingctx, a, off):
    """Prefetch (``prefetcht0``) the cache line holding byte ``off`` of array ``a``. No bounds check:
    a prefetch never faults, so ``off`` may lie past the array's end (the next row of a matrix)."""
    sig = types.void(a, off)

    def codegen(context, builder, signature, args):
        p = _byte_ptr(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        pf = _decl(builder.module, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        builder.call(pf, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        return context.get_dummy_value()

    return sig, codegen
# -- 8-row interleaved ("x8") layout: one activation block serves 8 rows ------------------------------
#
# ggml's repacked CPU path (ggml-cpu/repack.cpp, block_q4_0x8 / block_q4_Kx8 ...) lays the blocks of 8
# consecutive rows side by side, so a 512-bit vpdpbusd multiplies 8 bytes of each of the 8 rows with one
# 8-byte activation group broadcast to all of them. Our x8 layout, per group of 8 rows and block index
# i (``pack_x8`` in vecdot.py writes it), every byte range [a, a + n) of the row's block becomes
# [8a, 8a + 8n) of the group's block: a header field (X8_SPECS: fp16 scales, sub-block scales) of
# e-byte elements holds element k of row r at 8a + (8k + r) * e (so the 8 rows' values of one element
# are one vector load); the quant bytes are 64-byte slices, slice j holding bytes 8j..8j+7 of each row's
# quants (row r at 8r). Only bytes move: the copy is as large as the file's matrix.
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


def _x8_dot(b, dpb, acc, u, xb, off):
    """acc + vpdpbusd(u (8 bytes per row), activations xb[off:off+8] broadcast)."""
    return b.call(dpb, [acc, b.bitcast(u, V16I32), b.bitcast(_bcast8(b, xb, off), V16I32)])


def _x8_bits(b, v, shift, width, to=0):
    """Bits shift..shift+width-1 of each byte of <64 x i8> v at bits to..to+width-1, the rest 0: one bit
    field of 64 packed quant bytes, moved into place (one GFNI affine, ``_gf2_bits``)."""
    return _gf2_bits(b, v, {to + e: shift + e for e in range(width)})


def _gf2_bits(b, v, moves):
    """Each byte of <64 x i8> v with its bits moved (``moves``: {bit out: bit in}), the other bits 0:
    one ``vgf2p8affineqb`` (a shift and a mask in one instruction; GFNI, with AVX-512 here). The
    matrix byte 7 - o holds the input bits that make output bit o."""
    if not HAS_GFNI:  # the moves are one shift: shift and mask
        (d,) = {o - i for o, i in moves.items()}
        mask = _splat(I8, 64, sum(1 << o for o in moves))
        return b.and_(b.shl(v, _splat(I8, 64, d)) if d > 0 else b.lshr(v, _splat(I8, 64, -d)) if d else v, mask)
    row = [0] * 8
    for o, i in moves.items():
        row[7 - o] = 1 << i
    fn = _decl(b.module, "llvm.x86.vgf2p8affineqb.512", V64I8, [V64I8, V64I8, I8])
    return b.call(fn, [v, ir.Constant(V64I8, row * 8), ir.Constant(I8, 0)])


class _X8:
    """What an x8 emitter gets: builder, vpdpbusd, group-block pointer, this block's activations
    (quants, float scale, int32 sums pointer)."""

    def __init__(self, b, dpb, gb, xb, dx, sb):
        self.b, self.dpb, self.gb, self.xb, self.dx, self.sb = b, dpb, gb, xb, dx, sb

    def dxv(self):
        return _bcast(self.b, self.dx, V8F32)

    def xsum(self, i):
        return self.b.load(self.b.gep(self.sb, [ir.Constant(I64, i)]))

    def bsums(self):
        """The 16 activation sums of a super-block (one per 16 elements) -> <16 x i32>."""
        return _ld(self.b, self.b.bitcast(self.sb, I8.as_pointer()), 0, V16I32)

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

def _x8_legacy(q_off, offset, nibbles):
    def emit(k):
        b = k.b
        zero = ir.Constant(V16I32, None)
        acc = zero
        if nibbles:  # Q4_0: 2 slices; low nibbles elements 8j.., high 16+8j..
            for j in range(2):
                v = _ld(b, k.gb, q_off + 64 * j, V64I8)
                acc = _x8_dot(b, k.dpb, acc, b.and_(v, _splat(I8, 64, 15)), k.xb, 8 * j)
                acc = _x8_dot(b, k.dpb, acc, b.lshr(v, _splat(I8, 64, 4)), k.xb, 16 + 8 * j)
        else:  # Q8_0: 4 slices of int8, made unsigned by + 128
            for j in range(4):
                u = b.xor(_ld(b, k.gb, q_off + 64 * j, V64I8), _splat(I8, 64, 0x80))
                acc = _x8_dot(b, k.dpb, acc, u, k.xb, 8 * j)
        t8 = _pairs16(b, acc)
        neg = b.shl(k.xsum(0), ir.Constant(I32, offset.bit_length() - 1))
        t8 = b.sub(t8, _bcast(b, neg, V8I32))
        return [(t8, b.fmul(_x8_f16(b, k.gb, 0), k.dxv(), flags=_FM))]
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
            return _x8_bits(b, h, sub, 1, 4)

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


def _x8_scaled16(k, slices, scale, unsigned, bias_shift):
    """The K types with one scale per 16 elements (Q2_K, Q3_K, Q6_K): for each sub-block g (0..15),
    the dot of its two slices' unsigned values (``slices(g)`` -> [(u <64 x i8>, activation offset)])
    times its 8 rows' scale (``scale(g)`` -> (<8 x i32>, min or None)) -> summed per row. ``unsigned``
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
            for u, xo in slices(g):
                dot = _x8_dot(b, k.dpb, dot, u, k.xb, xo)
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

    def slices(g):
        n, rest = divmod(g, 8)
        j, h = divmod(rest, 2)
        out = []
        for s in (2 * h, 2 * h + 1):
            v = _ld(b, k.gb, 128 + 64 * (4 * n + s), V64I8)
            out.append((_x8_bits(b, v, 2 * j, 2), 128 * n + 32 * j + 8 * s))
        return out

    def scale(g):
        v = b.zext(_ld(b, k.gb, 8 * g, ir.VectorType(I8, 8)), V8I32)
        return b.and_(v, _splat(I32, 8, 15)), b.lshr(v, _splat(I32, 8, 4))

    isum, msum = _x8_scaled16(k, slices, scale, True, 0)
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

    def slices(g):
        ch, h = divmod(g, 2)
        n, j = divmod(ch, 4)
        out = []
        for s in (2 * h, 2 * h + 1):
            q = _ld(b, k.gb, 256 + 64 * (4 * n + s), V64I8)
            low = _x8_bits(b, q, 2 * j, 2)
            hb = _x8_bits(b, _ld(b, k.gb, 64 * s, V64I8), ch, 1, 2)
            out.append((b.or_(low, hb), 32 * ch + 8 * s))
        return out

    def scale(g):
        w = aux[g // 4]
        q = g % 4
        return b.sub(b.and_(b.lshr(w, c(8 * q)) if q else w, c(0xFF)), c(32)), None

    isum, _ = _x8_scaled16(k, slices, scale, False, 2)
    return [(isum, b.fmul(_x8_f16(b, k.gb, 864), k.dxv(), flags=_FM))]


def _x8_q6_k(k):
    """Q6_K: quants ql (0..1023: 8 x 128 bytes) and qh (1024..1535), then the 16 int8 scales (1536,
    element g of row r at 1536 + 8g + r) and d (1664). Per 16 elements: 2 slices, one scale. The
    unpack puts qh's two bits in place with one GFNI affine (``_gf2_bits``)."""
    b = k.b
    lo4, hi2 = _splat(I8, 64, 0x0F), _splat(I8, 64, 0x30)

    def slices(g):
        n, rest = divmod(g, 8)
        i, h = divmod(rest, 2)  # chunk i of half n, its 16-element half h
        out = []
        for j in (2 * h, 2 * h + 1):
            ql = _ld(b, k.gb, 512 * n + 256 * (i % 2) + 64 * j, V64I8)
            qh = _ld(b, k.gb, 1024 + 256 * n + 64 * j, V64I8)
            # ql's nibble to bits 0..3, bits 2i, 2i+1 of qh to bits 4, 5, the rest 0
            lo = b.and_(ql, lo4) if i < 2 else _x8_bits(b, ql, 4, 4)
            hb = b.and_(qh, hi2) if i == 2 else _x8_bits(b, qh, 2 * i, 2, 4)
            out.append((b.or_(lo, hb), 128 * n + 32 * i + 8 * j))
        return out

    def scale(g):
        return b.sext(_ld(b, k.gb, 1536 + 8 * g, ir.VectorType(I8, 8)), V8I32), None

    isum, _ = _x8_scaled16(k, slices, scale, False, 5)  # sub-block dots - 32 * bsums
    return [(isum, b.fmul(_x8_f16(b, k.gb, 1664), k.dxv(), flags=_FM))]


def _x8_iq4_xs(k):
    """IQ4_XS: header d (0), scales_h (16, u16 elements), scales_l (32, u32 elements); quants from 64:
    chunk c (32 elements) in slices 2c, 2c+1 (slice 2c+h: low nibbles elements 8h.., high 16+8h..),
    table values + 128 through a 512-bit pshufb; chunks in pairs as the K types' sub-blocks."""
    b = k.b
    dup = lambda v: b.shuffle_vector(v, v, _vconst(list(range(8)) * 2))  # noqa: E731  (both halves: a pair's)
    sh = dup(b.zext(_ld(b, k.gb, 16, ir.VectorType(I16, 8)), V8I32))
    sl = dup(_ld(b, k.gb, 32, V8I32))
    c = lambda n: _splat(I32, 16, n)  # noqa: E731
    lut = _decl(b.module, "llvm.x86.avx512.pshuf.b.512", V64I8, [V64I8, V64I8])
    table = ir.Constant(V64I8, list(_IQ4_U) * 4)
    xs = b.shl(k.sums32(), _splat(I32, 8, 7))  # 128 * sums: the table values' offset
    isum = None
    for p in range(4):
        dots = []
        for ch in (2 * p, 2 * p + 1):
            dot = ir.Constant(V16I32, None)
            for h in range(2):
                v = _ld(b, k.gb, 64 + 64 * (2 * ch + h), V64I8)
                lo = b.call(lut, [table, b.and_(v, _splat(I8, 64, 15))])
                hi = b.call(lut, [table, b.lshr(v, _splat(I8, 64, 4))])
                dot = _x8_dot(b, k.dpb, dot, lo, k.xb, 32 * ch + 8 * h)
                dot = _x8_dot(b, k.dpb, dot, hi, k.xb, 32 * ch + 16 + 8 * h)
            dots.append(dot)
        low = b.and_(b.lshr(sl, _vconst([4 * e for e in _twice(p)])), c(15))
        high = b.shl(b.and_(b.lshr(sh, _vconst([2 * e for e in _twice(p)])), c(3)), c(4))
        sc = b.sub(b.or_(low, high), c(32))
        t = b.mul(b.sub(_x8_pair(b, *dots), _shuf(b, xs, _twice(p))), sc)
        isum = t if isum is None else b.add(isum, t)
    return [(_fold16(b, isum), b.fmul(_x8_f16(b, k.gb, 0), k.dxv(), flags=_FM))]


#: type name -> (block bytes of one row, elements per block, activation sums per block, header fields
#: ((offset, bytes, element bytes) in the row's block), quant bytes (start, end), emitter)
X8_SPECS = {
    "Q8_0": (34, 32, 1, ((0, 2, 2),), (2, 34), _x8_legacy(16, 128, False)),
    "Q4_0": (18, 32, 1, ((0, 2, 2),), (2, 18), _x8_legacy(16, 8, True)),
    "Q2_K": (84, 256, 16, ((0, 16, 1), (80, 2, 2), (82, 2, 2)), (16, 80), _x8_q2_k),
    "Q3_K": (110, 256, 16, ((96, 12, 4), (108, 2, 2)), (0, 96), _x8_q3_k),
    "Q4_K": (144, 256, 16, ((0, 2, 2), (2, 2, 2), (4, 12, 4)), (16, 144), _x8_q4k_like(128)),
    "Q5_K": (176, 256, 16, ((0, 2, 2), (2, 2, 2), (4, 12, 4)), (16, 176), _x8_q4k_like(384, 128)),
    "Q6_K": (210, 256, 16, ((192, 16, 1), (208, 2, 2)), (0, 192), _x8_q6_k),
    "IQ4_XS": (136, 256, 16, ((0, 2, 2), (2, 2, 2), (4, 4, 4)), (8, 136), _x8_iq4_xs),
}
#: rows per interleaved group
X8_ROWS = 8
#: the x8 kernels need 512-bit VNNI (AVX512-VNNI + BW)
HAS_X8 = HAS_VNNI512


def _row_dot_x8(name):
    ts, qk, ns, _, _, emit = X8_SPECS[name]
    gts = X8_ROWS * ts
    unroll = 4 if qk == 32 else 2

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
            dpb = _decl(b.module, "llvm.x86.avx512.vpdpbusd.512", V16I32, [V16I32, V16I32, V16I32])
            pf = _decl(b.module, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
            accps = [cgutils.alloca_once_value(b, ir.Constant(V8F32, None)) for _ in range(unroll)]

            def one(i, u):
                k = _X8(b, dpb, b.gep(wp, [b.mul(i, ir.Constant(i.type, gts))]),
                        b.gep(xp, [b.mul(i, ir.Constant(i.type, qk))]), b.load(b.gep(dp, [i])),
                        b.gep(sp, [b.mul(i, ir.Constant(i.type, ns))]))
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

    impl.__name__ = f"row_{name.lower()}_x8"
    return intrinsic(impl)


def row_dots_x8() -> dict:
    """``{type name: ROWX8 intrinsic}``: ``ROWX8(wg, xq, xd, xs) -> 8 x float32``, the dots of the 8 rows
    of one x8 group (``wg``: its nb * 8 * block bytes) with one token's activations (vnni, 512-bit)."""
    return {name: _row_dot_x8(name) for name in X8_SPECS}
