"""LLVM-IR building blocks for the integer dot products, emitted with ``numba.extending.intrinsic``.

Plain numba types integer arithmetic as int64, so an int8 x int8 loop never becomes ``vpdpbusd``
(docs/kernels.md). Here the inner part of each block dot -- unpacking
the weight bits to 32 unsigned bytes per chunk and multiplying them with 32 int8 activations -- is
written as LLVM IR, and so is the rest of a row dot (fp16 scales, mins through the activation sums, the
float accumulate: ``ir_rowdot.row_dot``, one intrinsic per row), which ``vecdot.py`` binds into its bodies.

Every weight chunk is turned into *unsigned* bytes ``u`` (0..255); a signed format is written as
``u - offset`` (Q4_0: nibble - 8, Q8_0: (q ^ 0x80) - 128, Q6_K: q - 32, ...), and the caller
subtracts ``offset * sum(x)`` using the per-block activation sums (Q8_K's ``bsums``, our Q8_0/Q8_1
block sums). So every dot is u8 x s8, which is exactly ``vpdpbusd``.

Variants (the same numba bodies are compiled against either):

* ``vnni``    -- ``llvm.x86.avx512.vpdpbusd.256`` (AVX512-VNNI+VL, or AVX-VNNI: LLVM picks the VEX form)
* ``avx2``    -- ``vpmaddubsw`` + ``vpmaddwd`` (ggml's AVX2 dots; signed x signed with its sign trick)
* ``neon``    -- AArch64 ``sdot`` (``llvm.aarch64.neon.sdot``, the dot-product extension) on 16-byte
  halves, and ``tbl`` for the 16-entry tables; u below 128 is already a valid signed byte, a wide u is
  ``(u ^ 0x80) + 128`` (one more ``sdot`` against the activations gives the 128 * sum)
* ``generic`` -- target-independent IR: ``mul(zext u, sext x)`` summed to 8 lanes of 4 bytes (LLVM
  turns this into vpdpbusd/vpmaddubsw where it can, and into plain SIMD elsewhere)

A chunk dot produces 8 int32 lanes, lane i holding bytes 4i..4i+3; so lanes 0-3 are the first 16
elements and 4-7 the last 16, which is how per-16 scales (Q2_K, Q3_K, Q6_K) are applied before the
single horizontal reduction per (super-)block.

This module holds what every emitter shares: the host's features, the
variant in force, the IR helpers and the prefetch intrinsic. The emitters themselves: ``ir_rowdot``
(the chunk loaders and the whole-row dot loop, ``row_dot``) and ``ir_x8`` (the 8-row interleaved layout,
``X8``); which a type uses is its record's entry in ``cpu_traits``.
"""

from __future__ import annotations


from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit import config, isa
from quantkit.formats.ggml_types import type_info
from quantkit.jit import IS_X86, host_features
from quantkit.jit import byte_ptr as _byte_ptr
from quantkit.jit import ld_f32, ld_u16, ld_u32  # noqa: F401  (re-exported: the kernels' scalar loads)
from quantkit.quants.common import ld_bf16, ld_f16  # noqa: F401

# -- host features ---------------------------------------------------------------------------------

_FEATURES = host_features()
HAS_VNNI = IS_X86 and (("avx512vnni" in _FEATURES and "avx512vl" in _FEATURES) or "avxvnni" in _FEATURES)
#: 512-bit vpdpbusd (two 32-element blocks per instruction)
HAS_VNNI512 = IS_X86 and {"avx512f", "avx512bw", "avx512vnni"} <= _FEATURES
#: AVX2 (vpmaddubsw, vpmaddwd, pshufb on 256 bits): the avx2 variant and the 256-bit x8 dots
HAS_AVX2 = IS_X86 and "avx2" in _FEATURES
#: hardware half -> float (``fpext half``): F16C on x86; native elsewhere
HAS_F16 = (not IS_X86) or "f16c" in _FEATURES
#: BMI2's pdep (the lattice types' grid indices, kernels/lowbit.py)
HAS_BMI2 = IS_X86 and "bmi2" in _FEATURES
#: GFNI's vgf2p8affineqb (a byte's bits moved in one instruction: the x8 Q6_K unpack)
HAS_GFNI = IS_X86 and "gfni" in _FEATURES
#: AVX-512 (32 zmm registers): the float weights' prefill GEMM (gemm_float.py); with AVX512-BF16's
#: vdpbf16ps (two bf16 products per float32 lane) BF16's
HAS_AVX512F = IS_X86 and "avx512f" in _FEATURES
HAS_BF16_DOT = HAS_AVX512F and "avx512bf16" in _FEATURES
#: AArch64's int8 matrix multiply (``smmla``: 2x8 by 8x2 bytes into 2x2 int32), the ``i8mm`` level's GEMM
HAS_I8MM = not IS_X86 and "i8mm" in _FEATURES

#: the IR flavours of the integer dots (``_dot``), and ``plain`` (numba only, no IR)
VARIANTS = ("vnni", "avx2", "neon", "generic", "plain")
#: those this host can execute (the tests' parametrization)
RUNNABLE_VARIANTS = isa.runnable_variants()
#: opt-in (QUANTKIT_512=1): 32-element blocks two at a time with a 512-bit vpdpbusd where the CPU has
#: AVX512-VNNI. Off by default: on the development Xeon it measured 15-25% slower per core than the
#: 256-bit loop (zmm clock licence / extra shuffles); it may pay on CPUs without that penalty (Zen 4).
PAIRS_512 = config.pairs_512()
#: software prefetch distance (bytes ahead of the block being read) in the row dots; 0 turns it off
#: (``QUANTKIT_PREFETCH=n``). A decode step streams ~100 MB of weights from DRAM; the hardware
#: prefetchers alone left the loads exposed (SmolLM2 Q4_1, 1 thread: 20.5 -> 14.5 CPU-ms per token
#: with 2048; 1024 and 4096 were slower, and so were prefetcht1 and prefetchnta).
PREFETCH = config.prefetch_distance()
#: the same for the 8-row interleaved (x8) loops, whose one stream carries 8 rows (``QUANTKIT_X8_PREFETCH``).
#: Off by default: their reads ascend through one stream, which the hardware prefetchers follow, and
#: on Zen 4 a GEMV from DRAM ran at 0.91-1.06 of a plain streaming read without it against 0.63-0.91
#: with 4096 (Q4_K, Q8_0, IQ4_XS, Q6_K; docs/performance.md)
X8_PREFETCH = config.x8_prefetch_distance()


def int8_flavour(variant: str) -> str | None:
    """How the multi-row kernels (the x8 decode dots, the integer GEMM), written for 16 int32 lanes, run
    for a variant: ``vnni`` (one 512-bit vpdpbusd, where the CPU has 512-bit VNNI), ``avx2`` (two
    256-bit halves through the avx2 ``_dot``: the avx2 variant, and vnni on AVX-VNNI CPUs without
    AVX-512), ``neon`` (four 128-bit quarters, one ``sdot`` each: AArch64 with the dot product), or
    None (generic, plain: not built)."""
    if variant == "vnni" and HAS_VNNI512:
        return "vnni"
    if variant == "neon" and not IS_X86:
        return "neon"
    return "avx2" if variant in ("vnni", "avx2") and HAS_AVX2 else None


def gemm_flavour(variant: str) -> str | None:
    """The integer GEMM's flavour for a variant: ``int8_flavour``'s, but ``i8mm`` (``smmla`` on pairs of
    rows x pairs of tokens, kernels/gemm.py) for ``neon`` where the CPU has the int8 matrix multiply
    and the ``i8mm`` level is in force (``QUANTKIT_KERNELS=neon`` keeps sdot)."""
    f = int8_flavour(variant)
    return "i8mm" if f == "neon" and HAS_I8MM and isa.selected() == "i8mm" else f


def act_sums(name: str) -> int:
    """Activation sums per block of weight type ``name`` in the planar activations (activations.py) of its
    vec_dot type: Q8_K keeps one per 16 values (its ``bsums``), Q8_0 / Q8_1 one per 32."""
    t = type_info(name)
    return t.block_size // (16 if t.vec_dot_type == "Q8_K" else 32)


def default_variant() -> str:
    """The kernels' IR flavour for the CPU level in force (quantkit/isa.py): ``vnni`` (AVX-512 VNNI or
    AVX-VNNI), ``avx2``, ``neon``, ``generic``, or ``plain`` when ``QUANTKIT_KERNELS=plain``."""
    return isa.variant()


# -- IR helpers ------------------------------------------------------------------------------------

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
V8I32 = ir.VectorType(I32, 8)
V32I8 = ir.VectorType(I8, 32)
V16I8 = ir.VectorType(I8, 16)
V4I32 = ir.VectorType(I32, 4)
V32I32 = ir.VectorType(I32, 32)
V16I16 = ir.VectorType(I16, 16)


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
    if variant in ("vnni", "avx2"):  # AVX2 pshufb works within 128-bit lanes: the table is repeated
        fn = _decl(builder.module, "llvm.x86.avx2.pshuf.b", V32I8, [V32I8, V32I8])
        return builder.call(fn, [ir.Constant(V32I8, list(table) * 2), idx])
    if variant == "neon":  # tbl: 16-byte table, 16 indices per instruction
        fn = _decl(builder.module, "llvm.aarch64.neon.tbl1.v16i8", V16I8, [V16I8, V16I8])
        t = ir.Constant(V16I8, list(table))
        return _join(builder, *(builder.call(fn, [t, h]) for h in _halves(builder, idx)))
    # portable: a tree of selects on the index bits
    level = [_splat(I8, 32, t) for t in table]
    bit = 1
    while len(level) > 1:
        sel = builder.icmp_unsigned("!=", builder.and_(idx, _splat(I8, 32, bit)), _splat(I8, 32, 0))
        level = [builder.select(sel, level[i + 1], level[i]) for i in range(0, len(level), 2)]
        bit <<= 1
    return level[0]


def _maddubs(builder, u, x):
    """AVX2 ``vpmaddubsw``: <16 x i16> of u8 u[2i] * s8 x[2i] + u[2i+1] * x[2i+1], saturated to int16."""
    fn = _decl(builder.module, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [V32I8, V32I8])
    return builder.call(fn, [u, x])


def _madd16(builder, a, b16):
    """AVX2 ``vpmaddwd``: <8 x i32> of a[2i] * b[2i] + a[2i+1] * b[2i+1] (i16 x i16, exact)."""
    fn = _decl(builder.module, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16])
    return builder.call(fn, [a, b16])


def _pairs_to_lanes(builder, p16):
    """<16 x i16> pair sums -> <8 x i32> sums of 4 bytes (``vpmaddwd`` with ones, as ggml's AVX2 dots)."""
    return _madd16(builder, p16, _splat(I16, 16, 1))


def _madd_acc(builder, variant, acc, p16, s16):
    """acc + pairs of i16 ``p16 * s16`` summed to <8 x i32>: one ``vpdpwssd`` with VNNI, ``vpmaddwd`` + add
    on AVX2 (the scale step of ggml's AVX2 K-quant dots)."""
    if variant == "vnni":
        fn = _decl(builder.module, "llvm.x86.avx512.vpdpwssd.256", V8I32, [V8I32, V8I32, V8I32])
        return builder.call(fn, [acc, builder.bitcast(p16, V8I32), builder.bitcast(s16, V8I32)])
    return builder.add(acc, _madd16(builder, builder.bitcast(p16, V16I16), builder.bitcast(s16, V16I16)))


def _dot_s8(builder, acc, s, x):
    """AVX2: acc + per-4-byte-lane sums of s8 s * s8 x, with ggml's sign trick (``mul_sum_i8_pairs``):
    ``vpmaddubsw(|s|, sign(x, s))``. Exact while x > -128 (activations are quantized to -127..127)."""
    sign = _decl(builder.module, "llvm.x86.avx2.psign.b", V32I8, [V32I8, V32I8])
    ab = _decl(builder.module, "llvm.abs.v32i8", V32I8, [V32I8, ir.IntType(1)])
    t = _pairs_to_lanes(builder, _maddubs(builder, builder.call(ab, [s, ir.Constant(ir.IntType(1), 0)]),
                                          builder.call(sign, [x, s])))
    return t if acc is None else builder.add(acc, t)


def _halves(builder, v):
    """A 32-lane (or 8-lane) vector -> its two halves (one 128-bit NEON register each)."""
    n = v.type.count // 2
    return (builder.shuffle_vector(v, v, _vconst(range(n))), builder.shuffle_vector(v, v, _vconst(range(n, 2 * n))))


def _join(builder, a, b):
    """Two halves -> one vector of twice the lanes (the inverse of ``_halves``)."""
    return builder.shuffle_vector(a, b, _vconst(range(2 * a.type.count)))


def _sdot(builder, acc4, a, b):
    """NEON ``sdot``: <4 x i32> acc4 + per-4-byte-lane sums of s8 a * s8 b (<16 x i8> each)."""
    fn = _decl(builder.module, "llvm.aarch64.neon.sdot.v4i32.v16i8", V4I32, [V4I32, V16I8, V16I8])
    return builder.call(fn, [acc4, a, b])


def _dot_neon(builder, acc, u, x, wide):
    """``_dot`` with ``sdot`` on each 16-byte half. u < 128 is its own signed byte; a wide u is
    s + 128 with s = u ^ 0x80: sdot(s, x) - sdot(-128, x) (= + 128 * the sum of x, exactly)."""
    s = builder.xor(u, _splat(I8, 32, 0x80)) if wide else u
    accs = _halves(builder, acc) if acc is not None else (ir.Constant(V4I32, None),) * 2
    out = []
    for a4, sh, xh in zip(accs, _halves(builder, s), _halves(builder, x)):
        t = _sdot(builder, a4, sh, xh)
        if wide:
            t = builder.sub(t, _sdot(builder, ir.Constant(V4I32, None), _splat(I8, 16, -128), xh))
        out.append(t)
    return _join(builder, *out)


def _dot_small(builder, variant, pairs):
    """<8 x i32> per-4-byte-lane sums of u8 u * s8 x over the (u, x) ``pairs`` (32-byte vectors) whose u are
    so small that every ``vpmaddubsw`` pair sum, added up over all the pairs, fits int16 (the TQ types'
    trits 0..2: 8 chunks of at most 2 * 2 * 128). AVX2 adds the ``vpmaddubsw`` results as int16 and
    widens once (``vpmaddwd`` with ones), as ggml's AVX2 TQ dots do; the other variants chain ``_dot``."""
    if variant != "avx2":
        acc = None
        for u, x in pairs:
            acc = _dot(builder, variant, acc, u, x, wide=False)
        return acc
    s16 = None
    for u, x in pairs:
        p = _maddubs(builder, u, x)
        s16 = p if s16 is None else builder.add(s16, p)
    return _pairs_to_lanes(builder, s16)


def _dot(builder, variant, acc, u, x, wide=True):
    """acc (<8 x i32> or None) + per-4-byte-lane sums of u8 u * s8 x.

    ``wide=False`` says every u is below 128, so a pair of products fits int16: AVX2 then needs only
    ``vpmaddubsw`` + ``vpmaddwd``. A wide u (Q8_0's q ^ 0x80, the IQ4 / MXFP4 tables offset by 128) is
    ``s + 128`` with s = u ^ 0x80 signed: the signed dot plus 128 * the activations' sum."""
    if variant == "vnni":
        fn = _decl(builder.module, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, V8I32, V8I32])
        a = acc if acc is not None else ir.Constant(V8I32, None)
        return builder.call(fn, [a, builder.bitcast(u, V8I32), builder.bitcast(x, V8I32)])
    if variant == "avx2":
        if not wide:
            t = _pairs_to_lanes(builder, _maddubs(builder, u, x))
            return t if acc is None else builder.add(acc, t)
        s = builder.xor(u, _splat(I8, 32, 0x80))
        xsum = _pairs_to_lanes(builder, _maddubs(builder, _splat(I8, 32, 0x80), x))  # 128 * sums of x
        return _dot_s8(builder, builder.add(xsum, acc) if acc is not None else xsum, s, x)
    if variant == "neon":
        return _dot_neon(builder, acc, u, x, wide)
    m = builder.mul(builder.zext(u, V32I32), builder.sext(x, V32I32))
    parts = [builder.shuffle_vector(m, m, ir.Constant(V8I32, [4 * i + j for i in range(8)])) for j in range(4)]
    s = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))
    return s if acc is None else builder.add(acc, s)


def _reduce(builder, v):
    fn = _decl(builder.module, "llvm.vector.reduce.add.v8i32", I32, [V8I32])
    return builder.call(fn, [v])


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


def _e8m0_half(builder, e):
    """MXFP4's scale exponents ``e`` (i32, or <n x i32>, zero-extended bytes) as float32: ggml's
    GGML_E8M0_TO_FP32_HALF(e), 2^(e-128) (its table's values are doubled), with the two smallest
    exponents as subnormals."""
    n = e.type.count if isinstance(e.type, ir.VectorType) else 0

    def c(v):
        return _splat(I32, n, v) if n else ir.Constant(I32, v)
    small = builder.icmp_unsigned("<", e, c(2))
    sub = builder.sub(builder.select(small, c(1), e), c(1))
    bits = builder.select(small, builder.shl(c(0x00200000), e), builder.shl(sub, c(23)))
    return builder.bitcast(bits, ir.VectorType(F32T, n) if n else F32T)


def _fma_acc(builder, acc, ivec, scale):
    """acc + float(ivec) * scale (ivec <8 x i32>, scale a float)."""
    sv = builder.insert_element(ir.Constant(V8F32, None), scale, ir.Constant(I32, 0))
    sv = builder.shuffle_vector(sv, sv, ir.Constant(V8I32, [0] * 8))
    return builder.fadd(acc, builder.fmul(builder.sitofp(ivec, V8F32), sv, flags=_FM), flags=_FM)


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
