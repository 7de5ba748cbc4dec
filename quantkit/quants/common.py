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


@njit
def rt_len(k, y):
    """``k`` as a run-time value: min(k, len(y)), which is k for every row decoded (a row holds at least one
    block). An inner loop over a literal 16 or 32 is unrolled by LLVM and left scalar (its loads and stores
    may alias for all it knows); over a run-time count it is vectorized with a run-time overlap check --
    1.5-2x faster row decoders for the prefill's tiles."""
    return min(k, y.shape[0])


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
