"""Scalar helpers shared by every codec, compiled with numba (no fastmath: results must match ggml).

Conventions for every quantizer in this package (they are what make bytes match ggml):
* all arithmetic in float32, exactly as ggml's C does it -- write constants as ``np.float32(0.5)``
  and never let a Python float literal promote an expression to float64;
* ``nearest_int`` is ggml's magic-number rounding reproduced on the bits (ties to even; for |x| >= 2**22,
  inf and NaN it returns what ggml's does), ``c_f2i`` C's float -> int cast as x86 does it;
* fp16 fields are converted with ``fp32_to_fp16`` (round to nearest even, as F16C / ggml's generic
  code) and read back with ``fp16_to_fp32``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from quantkit.formats.ggml_types import type_info
from quantkit.jit import (HAS_F16C, bits_to_f32, f32_to_bits, f32_to_half_bits, half_bits_to_f32, ld_f16_hw, ld_u16,
                          njit)

#: ggml's GROUP_MAX_EPS: a group whose largest magnitude is below it is quantized as all zeros
GROUP_MAX_EPS = np.float32(1e-15)


@njit
def fp32_to_fp16(f):
    """float32 -> IEEE half bits (uint16), round to nearest even; overflow gives inf."""
    if HAS_F16C:  # one vcvtps2ph; the bit-level version below is the portable fallback
        return f32_to_half_bits(np.float32(f))
    return fp32_to_fp16_bits(f)


@njit
def fp32_to_fp16_bits(f):
    """Portable float32 -> half bits, the same rounding as F16C's vcvtps2ph (nearest even)."""
    bits = f32_to_bits(np.float32(f))
    sign = np.uint32((bits >> np.uint32(16)) & np.uint32(0x8000))
    exp = np.int32((bits >> np.uint32(23)) & np.uint32(0xFF))
    mant = np.uint32(bits & np.uint32(0x7FFFFF))
    if exp == 0xFF:  # inf or nan
        if mant != 0:
            return np.uint16(sign | np.uint32(0x7E00))
        return np.uint16(sign | np.uint32(0x7C00))
    e = exp - 127 + 15
    if e >= 31:
        return np.uint16(sign | np.uint32(0x7C00))
    if e <= 0:
        if e < -10 or exp == 0:
            return np.uint16(sign)
        m = mant | np.uint32(0x800000)
        shift = np.uint32(14 - e)
        half = m >> shift
        rem = m & ((np.uint32(1) << shift) - np.uint32(1))
        halfway = np.uint32(1) << (shift - np.uint32(1))
        if rem > halfway or (rem == halfway and (half & np.uint32(1)) != 0):
            half += np.uint32(1)
        return np.uint16(sign | half)
    half = (np.uint32(e) << np.uint32(10)) | (mant >> np.uint32(13))
    rem = mant & np.uint32(0x1FFF)
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (half & np.uint32(1)) != 0):
        half += np.uint32(1)  # a carry into the exponent is the correct rounding (up to inf)
    return np.uint16(sign | half)


@njit
def fp16_to_fp32(h):
    """IEEE half bits (any unsigned int) -> float32, exact."""
    if HAS_F16C:
        return half_bits_to_f32(np.uint16(h))
    return fp16_to_fp32_bits(h)


@njit
def fp16_to_fp32_bits(h):
    """Portable half bits -> float32 (exact)."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    mant = h & np.uint32(0x3FF)
    if exp == 0:
        v = np.float32(mant) * np.float32(5.960464477539063e-08)  # mant * 2**-24, exact
        return -v if sign != 0 else v
    if exp == 31:
        return bits_to_f32(sign | np.uint32(0x7F800000) | (mant << np.uint32(13)))
    return bits_to_f32(sign | ((exp + np.uint32(112)) << np.uint32(23)) | (mant << np.uint32(13)))


@njit
def fp32_to_bf16(f):
    """float32 -> bfloat16 bits, round to nearest even; NaN kept quiet (as ggml)."""
    u = f32_to_bits(np.float32(f))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) | np.uint32(64))
    return np.uint16((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))


@njit
def bf16_to_fp32(h):
    return bits_to_f32(np.uint32(h) << np.uint32(16))


@njit
def nearest_int(fval):
    """ggml's ``nearest_int``: add 1.5*2**23 and read the low mantissa bits back (ties to even).

    For |fval| >= 2**22, inf and NaN it returns what ggml returns (wrapped garbage, 0 for NaN) instead
    of raising or being undefined, so even degenerate blocks give ggml's bytes."""
    val = np.float32(np.float32(fval) + np.float32(12582912.0))
    return np.int32(f32_to_bits(val) & np.uint32(0x007FFFFF)) - np.int32(0x00400000)


@njit
def c_roundf(v):
    """C's ``roundf``: nearest, ties away from zero (exact for every float32)."""
    v = np.float32(v)
    if not (np.abs(v) < np.float32(8388608.0)):  # already integral, inf or NaN
        return v
    t = np.float32(np.trunc(v))
    if np.abs(np.float32(v - t)) >= np.float32(0.5):
        t = t + (np.float32(1.0) if v > 0 else np.float32(-1.0))
    return t


@njit
def wrap_i8(v):
    """C's conversion of an int to int8_t (keep the low byte, two's complement)."""
    return np.int32(((np.int64(v) & 0xFF) ^ 0x80) - 0x80)


@njit
def c_f2i(v):
    """C's float -> int conversion as x86 performs it (cvttss2si): truncate toward zero;
    NaN and values outside int32 give INT32_MIN."""
    v = np.float32(v)
    if not (v > np.float32(-2147483904.0) and v < np.float32(2147483648.0)):
        return np.int32(-2147483648)
    return np.int32(v)


@njit
def put_f16(y, pos, f):
    """Store float32 ``f`` as a little-endian fp16 at byte ``pos`` of uint8 array ``y``."""
    h = fp32_to_fp16(f)
    y[pos] = np.uint8(h & np.uint16(0xFF))
    y[pos + 1] = np.uint8(h >> np.uint16(8))


@njit
def get_f16(y, pos):
    """Read a little-endian fp16 at byte ``pos`` of uint8 array ``y`` as float32."""
    return fp16_to_fp32(np.uint32(y[pos]) | (np.uint32(y[pos + 1]) << np.uint32(8)))


def block_layout(name: str, *fields: str) -> tuple[int, ...]:
    """``(type size, offset of each of fields)`` of a type's block, from the type table
    (formats/ggml_types.py): module-level ints that numba compiles in as constants."""
    t = type_info(name)
    return (t.type_size, *(t.field(f) for f in fields))


@intrinsic
def _opaque(typingctx, v):
    """``v`` unchanged, through an empty inline asm, so LLVM cannot see its value (nor fold it into a
    constant); no side effect, so it is still hoisted out of loops."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        t = context.get_value_type(signature.args[0])
        return builder.call(ir.InlineAsm(ir.FunctionType(t, [t]), "", "=r,0"), [args[0]])

    return v(v), codegen


@njit(inline="always")
def rt_len(k):
    """``k`` as a run-time value no larger than ``k``. An inner loop over a literal 16 or 32 is unrolled by
    LLVM and left scalar (its loads and stores may alias for all it knows); over a run-time count it is
    vectorized with a run-time overlap check -- 1.5-2x faster row decoders for the prefill's tiles. The
    count must be opaque, not merely computed (``min(k, len(block))`` of a block's slice LLVM folds to
    the literal again), and known to be at most ``k``, else the vectorizer interleaves past it and a
    32-value loop runs in its scalar remainder. Loop-invariant, so hoisted out of a row's block loop.
    The block decoders index their block's bytes directly, not through a second slice, for the same
    reason (the slices' bookkeeping costs a 32-value block a quarter of its time)."""
    return min(k, _opaque(k))


@njit
def _ld_f16_soft(a, off):
    return get_f16(a, off)


#: the fp16 at byte ``off`` of a uint8 array as float32, exact (``fpext half`` where the CPU has F16C)
ld_f16 = ld_f16_hw if HAS_F16C else _ld_f16_soft


@njit
def ld_bf16(a, off):
    """The bfloat16 at byte ``off`` of a uint8 array as float32."""
    return bf16_to_fp32(ld_u16(a, off))


@njit
def put_f32(y, pos, f):
    b = f32_to_bits(np.float32(f))
    y[pos] = np.uint8(b & np.uint32(0xFF))
    y[pos + 1] = np.uint8((b >> np.uint32(8)) & np.uint32(0xFF))
    y[pos + 2] = np.uint8((b >> np.uint32(16)) & np.uint32(0xFF))
    y[pos + 3] = np.uint8(b >> np.uint32(24))


@njit
def get_f32(y, pos):
    b = (np.uint32(y[pos]) | (np.uint32(y[pos + 1]) << np.uint32(8))
         | (np.uint32(y[pos + 2]) << np.uint32(16)) | (np.uint32(y[pos + 3]) << np.uint32(24)))
    return bits_to_f32(b)


@njit
def take_columns(LT, AT, mask):
    """Column k of ``AT`` replaces column k of ``LT`` where ``mask[k]``: the lane searches' "keep this
    step's levels" for every lane at once (a select, so the loop over lanes vectorizes)."""
    for i in range(LT.shape[0]):
        li = LT[i]
        ai = AT[i]
        for k in range(LT.shape[1]):
            li[k] = ai[k] if mask[k] else li[k]


@njit
def absmax_lanes(XT):
    """Per column of ``XT`` [n, nl]: the largest magnitude and the signed value that has it (the first
    on ties, as ggml's ``if (ax > amax)`` loops), both 0 for an all-zero column."""
    nl = XT.shape[1]
    amax = np.zeros(nl, dtype=np.float32)
    vmax = np.zeros(nl, dtype=np.float32)
    for i in range(XT.shape[0]):
        xi = XT[i]
        for k in range(nl):
            ax = np.abs(xi[k])
            take = ax > amax[k]
            amax[k] = ax if take else amax[k]
            vmax[k] = xi[k] if take else vmax[k]
    return amax, vmax


@njit
def absmax_signed(x):
    """The value of largest magnitude (the first on ties, as ggml's ``if (ax > amax)`` loops) and its
    magnitude; both 0 for an all-zero ``x``."""
    amax = np.float32(0.0)
    vmax = np.float32(0.0)
    for j in range(x.shape[0]):
        a = np.abs(x[j])
        if amax < a:
            amax = a
            vmax = x[j]
    return vmax, amax


@njit(inline="always")
def sum_squares(x):
    """sum(x^2) in float32, summed in order (every weighted path's sigma2 before its own scaling)."""
    s = np.float32(0.0)
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s


@njit(inline="always")
def imatrix_weight(qw, v, sigma2):
    """ggml's per-value weight of the weighted paths: qw * sqrt(sigma2 + x^2)."""
    return qw * np.float32(np.sqrt(np.float32(sigma2 + v * v)))


@njit(inline="always")
def pack_nibbles(L, y, pos, n):
    """Levels 0..15 of ``n`` values, 16 bytes per 32: value j of a 32-group in the low nibble of byte j,
    value j + 16 in the high nibble (Q4_0, Q4_1, IQ4_NL, IQ4_XS); stored as C's uint8 would."""
    for i in range(n // 32):
        for j in range(16):
            y[pos + 16 * i + j] = np.uint8((np.int32(L[32 * i + j]) | (np.int32(L[32 * i + 16 + j]) << 4)) & 0xFF)


# -- pieces of the IQ types' grid searches (IQ1, IQ2, IQ3) -----------------------------------------
@njit
def max_of(x):
    """The largest value of ``x`` (the first on ties), as ggml's ``max = MAX(max, x)`` loops."""
    m = x[0]
    for i in range(1, x.shape[0]):
        m = m if m > x[i] else x[i]
    return m


@njit
def odd_scale_level(inv, scale, top):
    """A block scale as an odd multiple of the super-scale: ``clamp(nearest_int((inv * scale - 1) / 2),
    0, top)`` (the IQ types' ``(2 l + 1) * d`` scales)."""
    l = nearest_int(np.float32(0.5) * (inv * scale - np.float32(1.0)))
    return 0 if l < 0 else (top if l > top else l)


@njit
def split_signs(xb, weight, xval, ngroup, even, signs):
    """Magnitudes into ``xval`` and a sign mask per group of 8 into ``signs``; with ``even`` (IQ2_XXS,
    IQ2_XS, IQ3_XXS, whose 8th sign is implied) an odd count of minus signs is made even by flipping the
    value with the least ``w * x^2`` (its magnitude then enters the search negated), and the mask keeps
    7 bits."""
    for k in range(ngroup):
        nflip = 0
        s = 0
        for i in range(8):
            v = xb[8 * k + i]
            if v >= np.float32(0.0):
                xval[8 * k + i] = v
            else:
                xval[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if even:
            if nflip % 2:
                imin = 0
                mn = weight[8 * k] * xb[8 * k] * xb[8 * k]
                for i in range(1, 8):
                    ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i]
                    if ax < mn:
                        mn = ax
                        imin = i
                xval[8 * k + imin] = -xval[8 * k + imin]
                s ^= 1 << imin
            s &= 127
        signs[k] = s


@njit
def search_scratch(n, ngroup):
    """Work arrays of one block of ``n`` values searched in ``ngroup`` groups: weight, waux, xval, L, Laux
    (n each), on_grid, on_aux (ngroup), signs (one per 8 values)."""
    return (np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32),
            np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32), np.empty(ngroup, dtype=np.bool_),
            np.empty(ngroup, dtype=np.bool_), np.empty(n // 8, dtype=np.int32))
