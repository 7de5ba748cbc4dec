"""Row decoders: one GGUF weight row (uint8 bytes) -> float32, as ggml's ``dequantize_row_X``.

Each ``deq_X(src, y)`` takes one row's bytes ``src`` (1-D uint8) and writes ``y`` (1-D float32),
with float32 arithmetic in the C code's order (no fastmath), so the values equal ggml's and
``gguf.quants.dequantize``. They serve ``get_rows`` (embedding lookup), the prefill path (tiles of
rows dequantized and multiplied with BLAS) and the ``plain`` decode variant.
"""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit
from quantkit.kernels.ir import KVALUES_IQ4NL, ld_bf16, ld_f16, ld_f32, ld_u16, ld_u32

_KV = np.array(KVALUES_IQ4NL, dtype=np.float32)
F = np.float32


@njit
def _rt(k, y):
    """``k`` as a run-time value: min(k, len(y)), which is k for every row decoded here (a row holds at
    least one block). An inner loop over a literal 16 or 32 is unrolled by LLVM and left scalar (its
    loads and stores may alias for all it knows); over a run-time count it is vectorized with a run-time
    overlap check -- 1.5-2x faster decoders for the prefill's tiles."""
    return min(k, y.shape[0])


@njit
def deq_f32(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_f32(src, 4 * j)


@njit
def deq_f16(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_f16(src, 2 * j)


@njit
def deq_bf16(src, y):
    for j in range(y.shape[0]):
        y[j] = ld_bf16(src, 2 * j)


@njit
def deq_q8_0(src, y):
    n32 = _rt(32, y)
    for b in range(y.shape[0] // 32):
        o = 34 * b
        d = ld_f16(src, o)
        q = src[o + 2:o + 34]
        yy = y[32 * b:32 * b + 32]
        for j in range(n32):
            yy[j] = F(np.int8(q[j])) * d


@njit
def deq_q4_0(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 32):
        o = 18 * b
        d = ld_f16(src, o)
        qs = src[o + 2:o + 18]
        yy = y[32 * b:32 * b + 32]
        for j in range(n16):
            yy[j] = F((np.int32(qs[j]) & 15) - 8) * d
        for j in range(n16):
            yy[j + 16] = F((np.int32(qs[j]) >> 4) - 8) * d


@njit
def deq_q4_1(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 32):
        o = 20 * b
        d = ld_f16(src, o)
        m = ld_f16(src, o + 2)
        qs = src[o + 4:o + 20]
        yy = y[32 * b:32 * b + 32]
        for j in range(n16):
            yy[j] = F(np.int32(qs[j]) & 15) * d + m
        for j in range(n16):
            yy[j + 16] = F(np.int32(qs[j]) >> 4) * d + m


@njit
def deq_q5_0(src, y):
    for b in range(y.shape[0] // 32):
        o = 22 * b
        d = ld_f16(src, o)
        qh = ld_u32(src, o + 2)
        for j in range(16):
            q = np.int32(src[o + 6 + j])
            h0 = np.int32(((qh >> np.uint32(j)) << np.uint32(4)) & np.uint32(0x10))
            h1 = np.int32((qh >> np.uint32(j + 12)) & np.uint32(0x10))
            y[32 * b + j] = F(((q & 15) | h0) - 16) * d
            y[32 * b + j + 16] = F(((q >> 4) | h1) - 16) * d


@njit
def deq_q5_1(src, y):
    for b in range(y.shape[0] // 32):
        o = 24 * b
        d = ld_f16(src, o)
        m = ld_f16(src, o + 2)
        qh = ld_u32(src, o + 4)
        for j in range(16):
            q = np.int32(src[o + 8 + j])
            h0 = np.int32(((qh >> np.uint32(j)) << np.uint32(4)) & np.uint32(0x10))
            h1 = np.int32((qh >> np.uint32(j + 12)) & np.uint32(0x10))
            y[32 * b + j] = F((q & 15) | h0) * d + m
            y[32 * b + j + 16] = F((q >> 4) | h1) * d + m


@njit
def deq_iq4_nl(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 32):
        o = 18 * b
        d = ld_f16(src, o)
        qs = src[o + 2:o + 18]
        yy = y[32 * b:32 * b + 32]
        for j in range(n16):
            yy[j] = d * _KV[np.int32(qs[j]) & 15]
        for j in range(n16):
            yy[j + 16] = d * _KV[np.int32(qs[j]) >> 4]


@njit
def deq_q2_k(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 256):
        o = 84 * b
        d = ld_f16(src, o + 80)
        dmin = ld_f16(src, o + 82)
        is_ = 0
        for n in range(2):
            q = o + 16 + 32 * n
            for j in range(4):
                shift = 2 * j
                base = 256 * b + 128 * n + 32 * j
                for half in range(2):
                    sc = np.int32(src[o + is_])
                    is_ += 1
                    dl = d * F(sc & 15)
                    ml = dmin * F(sc >> 4)
                    qs = src[q + 16 * half:q + 16 * half + 16]
                    yy = y[base + 16 * half:base + 16 * half + 16]
                    for l in range(n16):
                        yy[l] = dl * F((np.int32(qs[l]) >> shift) & 3) - ml


@njit
def _q3_scale(src, so, j):
    low = np.int32(src[so + j]) & 15 if j < 8 else np.int32(src[so + j - 8]) >> 4
    high = (np.int32(src[so + 8 + (j % 4)]) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit
def deq_q3_k(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 256):
        o = 110 * b
        d_all = ld_f16(src, o + 108)
        is_ = 0
        m = 1
        for n in range(2):
            q = o + 32 + 32 * n
            for j in range(4):
                shift = 2 * j
                base = 256 * b + 128 * n + 32 * j
                for half in range(2):
                    dl = d_all * F(_q3_scale(src, o + 96, is_))
                    is_ += 1
                    qs = src[q + 16 * half:q + 16 * half + 16]
                    hm = src[o + 16 * half:o + 16 * half + 16]
                    yy = y[base + 16 * half:base + 16 * half + 16]
                    for l in range(n16):
                        hv = 0 if (np.int32(hm[l]) & m) else 4
                        yy[l] = dl * F(((np.int32(qs[l]) >> shift) & 3) - hv)
                m <<= 1


@njit
def _scale_min_k4(src, so, j):
    """ggml's get_scale_min_k4 on the 12 scale bytes at ``so``."""
    if j < 4:
        return np.int32(src[so + j]) & 63, np.int32(src[so + j + 4]) & 63
    sc = (np.int32(src[so + j + 4]) & 0xF) | ((np.int32(src[so + j - 4]) >> 6) << 4)
    mn = (np.int32(src[so + j + 4]) >> 4) | ((np.int32(src[so + j]) >> 6) << 4)
    return sc, mn


@njit
def deq_q4_k(src, y):
    n32 = _rt(32, y)
    for b in range(y.shape[0] // 256):
        o = 144 * b
        d = ld_f16(src, o)
        dmin = ld_f16(src, o + 2)
        for j in range(4):
            sc, mn = _scale_min_k4(src, o + 4, 2 * j)
            d1 = d * F(sc)
            m1 = dmin * F(mn)
            sc, mn = _scale_min_k4(src, o + 4, 2 * j + 1)
            d2 = d * F(sc)
            m2 = dmin * F(mn)
            q = src[o + 16 + 32 * j:o + 48 + 32 * j]
            yy = y[256 * b + 64 * j:256 * b + 64 * j + 64]
            for l in range(n32):
                yy[l] = d1 * F(np.int32(q[l]) & 15) - m1
            for l in range(n32):
                yy[32 + l] = d2 * F(np.int32(q[l]) >> 4) - m2


@njit
def deq_q5_k(src, y):
    for b in range(y.shape[0] // 256):
        o = 176 * b
        d = ld_f16(src, o)
        dmin = ld_f16(src, o + 2)
        for j in range(4):
            sc, mn = _scale_min_k4(src, o + 4, 2 * j)
            d1 = d * F(sc)
            m1 = dmin * F(mn)
            sc, mn = _scale_min_k4(src, o + 4, 2 * j + 1)
            d2 = d * F(sc)
            m2 = dmin * F(mn)
            q = src[o + 48 + 32 * j:o + 80 + 32 * j]
            qh = src[o + 16:o + 48]
            yy = y[256 * b + 64 * j:256 * b + 64 * j + 64]
            for l in range(32):
                hb = ((np.int32(qh[l]) >> (2 * j)) & 1) << 4
                yy[l] = d1 * F((np.int32(q[l]) & 15) + hb) - m1
            for l in range(32):
                hb = ((np.int32(qh[l]) >> (2 * j + 1)) & 1) << 4
                yy[32 + l] = d2 * F((np.int32(q[l]) >> 4) + hb) - m2


@njit
def deq_q6_k(src, y):
    for b in range(y.shape[0] // 256):
        o = 210 * b
        d = ld_f16(src, o + 208)
        for n in range(2):
            ql = src[o + 64 * n:o + 64 * n + 64]
            qh = src[o + 128 + 32 * n:o + 160 + 32 * n]
            sc = o + 192 + 8 * n
            yy = y[256 * b + 128 * n:256 * b + 128 * n + 128]
            for half in range(2):  # is = l // 16
                s1 = d * F(np.int8(src[sc + half]))
                s2 = d * F(np.int8(src[sc + half + 2]))
                s3 = d * F(np.int8(src[sc + half + 4]))
                s4 = d * F(np.int8(src[sc + half + 6]))
                for i in range(16):
                    l = 16 * half + i
                    a = np.int32(ql[l])
                    c = np.int32(ql[l + 32])
                    h = np.int32(qh[l])
                    yy[l] = s1 * F(((a & 15) | ((h & 3) << 4)) - 32)
                    yy[l + 32] = s2 * F(((c & 15) | (((h >> 2) & 3) << 4)) - 32)
                    yy[l + 64] = s3 * F(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                    yy[l + 96] = s4 * F(((c >> 4) | (((h >> 6) & 3) << 4)) - 32)


@njit
def _iq4_xs_scale(src, o, ib):
    sh = ld_u16(src, o + 2)
    low = (np.int32(src[o + 4 + ib // 2]) >> (4 * (ib % 2))) & 15
    high = np.int32((sh >> np.uint32(2 * ib)) & np.uint32(3))
    return (low | (high << 4)) - 32


@njit
def deq_iq4_xs(src, y):
    n16 = _rt(16, y)
    for b in range(y.shape[0] // 256):
        o = 136 * b
        d = ld_f16(src, o)
        for ib in range(8):
            dl = d * F(_iq4_xs_scale(src, o, ib))
            q = src[o + 8 + 16 * ib:o + 24 + 16 * ib]
            yy = y[256 * b + 32 * ib:256 * b + 32 * ib + 32]
            for j in range(n16):
                yy[j] = dl * _KV[np.int32(q[j]) & 15]
            for j in range(n16):
                yy[j + 16] = dl * _KV[np.int32(q[j]) >> 4]
