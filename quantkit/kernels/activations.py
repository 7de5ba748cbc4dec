"""Activation quantizers: float32 rows -> the vec_dot type, as ggml's CPU ``from_float`` reference.

We keep quantized activations *planar* -- three arrays instead of ggml's interleaved blocks -- so the
dot kernels read 32 contiguous int8 per block and the per-block integer sums are at hand:

* ``qs`` int8  (n_tok, n_in)        the quants
* ``d``  float32 (n_tok, n_in/QK)   the block scale (Q8_0/Q8_1: the fp16-rounded value ggml stores;
  Q8_K: the float32 ``d``)
* ``s``  (n_tok, n_in/G)            per group of G: Q8_0: int32 sum of qs (G = 32); Q8_1: ggml's fp16
  ``s = d * sum(qs)`` as float32; Q8_K: int32 ``bsums`` (G = 16)

Rounding follows what llama.cpp's CPU backend runs on x86, which is what our logits are compared with:
its SIMD ``quantize_row_q8_0`` / ``_q8_1`` (multiplier ``127/amax``, round half to even; Q8_1's ``s``
from the unrounded scale) and ``quantize_row_q8_K_ref`` (``nearest_int``, ``iscale = -127/max``).
tests/data/golden/activations.npz holds ggml's own bytes for all three (tools/make_activation_golden.py).
``pack_q8_0`` / ``pack_q8_1`` / ``pack_q8_k`` write ggml's block bytes, for tests and interchange.

F16 / BF16 weights take float activations rounded to that type (ggml's vec_dot_type F16 / BF16):
kinds 'F16' / 'BF16' are the float32 rows rounded once (``round_f16_into`` / ``round_bf16_into``), so
a GEMV rounds each activation once, not once per weight row.
"""

from __future__ import annotations

import numpy as np

from quantkit.formats.ggml_types import block_size
from quantkit.jit import bits_to_f32, f32_to_bits, njit, njit_parallel, prange, specialize
from quantkit.quants.common import bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16, nearest_int


@njit(inline="always")
def _absmax_bits(xr, o, n):
    """max |x| over the block ``xr[o:o + n]`` (float32) as float32 bits (uint32), NaNs
    passed over as ggml's ``fabsf(x) > amax`` passes them: for non-NaN floats the order of |x|'s bit
    patterns is the order of |x|, and an integer max vectorizes without fastmath."""
    m = np.uint32(0)
    for j in range(n):
        a = f32_to_bits(xr[o + j]) & np.uint32(0x7FFFFFFF)
        m = max(m, a if a <= np.uint32(0x7F800000) else np.uint32(0))
    return m


@njit(inline="always")
def _signed_max_bits(xr, o, n, m):
    """The bits of the first x in ``xr[o:o + n]`` whose |x| has the bits ``m`` (ggml's signed ``max``
    of ``quantize_row_q8_K_ref``). Whether +|x| and -|x| occur is two integer max reductions, which
    vectorize; only a block holding both is scanned for the first."""
    neg = m | np.uint32(0x80000000)
    has_pos = np.uint32(0)
    has_neg = np.uint32(0)
    for j in range(n):
        b = f32_to_bits(xr[o + j])
        has_pos = max(has_pos, np.uint32(b == m))
        has_neg = max(has_neg, np.uint32(b == neg))
    if has_pos == 0 or has_neg == 0:
        return m if has_pos else neg
    for j in range(n):
        b = f32_to_bits(xr[o + j])
        if b == m or b == neg:
            return b
    return m


@njit
def quantize_q8_01_into(x, qs, d, s, sf, want_sf):
    """The Q8_0 / Q8_1 activation quantizer of ggml's x86 CPU backend (``quantize_row_q8_0`` /
    ``_q8_1`` with AVX): per block of 32, ``d = amax/127`` stored as fp16, quants
    ``rint(x * (127/amax))`` (round half to even), ``s`` = int32 sum of the quants and, with ``want_sf``,
    Q8_1's ``sf = fp16(d * sum)`` from the unrounded d, as float32.

    The block length is read from the shapes (n_in / d's columns), not written as 32: with a constant
    trip count LLVM unrolls the block's loops and leaves them scalar; with a run-time one it vectorizes
    them (0.78 -> 0.2 ns per element, 1 thread)."""
    n_tok, n_in = x.shape
    qk = n_in // d.shape[1]
    for t in range(n_tok):
        xr, qr = x[t], qs[t]
        for b in range(n_in // qk):
            o = b * qk
            amax = bits_to_f32(_absmax_bits(xr, o, qk))
            dd = amax / np.float32(127.0)
            idd = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            tot = 0
            for j in range(qk):
                q = np.int32(np.rint(xr[o + j] * idd))
                qr[o + j] = q
                tot += q
            d[t, b] = fp16_to_fp32(fp32_to_fp16(dd))
            s[t, b] = tot
            if want_sf:
                sf[t, b] = fp16_to_fp32(fp32_to_fp16(dd * np.float32(tot)))


@njit
def quantize_q8_0_into(x, qs, d, s):
    """x float32 (n_tok, n_in) -> qs int8 (n_tok, n_in), d float32 (n_tok, n_in/32), s int32 (same)."""
    quantize_q8_01_into(x, qs, d, s, np.empty((0, 0), np.float32), False)


@njit
def quantize_q8_1_into(x, qs, d, s):
    """Q8_1: the quants and scales of Q8_0, and s float32 (n_tok, n_in/32) = ggml's fp16 ``s``."""
    tmp = np.empty((x.shape[0], x.shape[1] // 32), np.int32)
    quantize_q8_01_into(x, qs, d, tmp, s, True)


@njit
def quantize_q8_k_into(x, qs, d, s):
    """x float32 (n_tok, n_in) -> qs int8 (n_tok, n_in), d float32 (n_tok, n_in/256),
    s int32 (n_tok, n_in/16) = ggml's bsums (``quantize_row_q8_K_ref``: ``iscale = -127/max`` with max
    the first x of the largest |x|, quants ``min(127, nearest_int(iscale * x))``). Block and group
    lengths come from the shapes, as in ``quantize_q8_01_into``, so the loops vectorize."""
    n_tok, n_in = x.shape
    qk = n_in // d.shape[1]
    gl = n_in // s.shape[1]
    ng = qk // gl
    for t in range(n_tok):
        xr, qr = x[t], qs[t]
        for b in range(n_in // qk):
            o = b * qk
            m = _absmax_bits(xr, o, qk)
            if m == 0:
                d[t, b] = 0
                qr[o:o + qk] = 0
                s[t, b * ng:(b + 1) * ng] = 0
                continue
            mx = bits_to_f32(_signed_max_bits(xr, o, qk, m))
            iscale = np.float32(-127.0) / mx
            for j in range(qk):
                qr[o + j] = min(127, nearest_int(iscale * xr[o + j]))
            for g in range(ng):
                tot = 0
                for j in range(gl):
                    tot += qr[o + g * gl + j]
                s[t, b * ng + g] = tot
            d[t, b] = np.float32(1.0) / iscale


@njit
def _block_absmax_bits(xi):
    """max |x| over a block as float32 bits (``xi``: the block's float32 bits as uint32): for finite
    floats the order of |x|'s bit patterns is the order of |x|, and an integer max vectorizes without
    fastmath."""
    m = np.uint32(0)
    for j in range(xi.shape[0]):
        m = max(m, xi[j] & np.uint32(0x7FFFFFFF))
    return m


@njit_parallel
def round_trip_q8_into(x, kind, out, qk):
    """out = the values ggml's integer dot sees for activations x: quantized to ``kind`` (1 = Q8_0 or
    Q8_1, 2 = Q8_K) and decoded back (q * d), the same values as ``quantize_q8_0_into`` /
    ``quantize_q8_k_into`` followed by q * d (tests/test_kernels.py). The BLAS prefill multiplies these,
    so a batch sees the same activation rounding as llama.cpp's (whose batches also go through
    from_float). prange over tokens: the same values for any thread count.

    ``qk`` is the Q8_0 block length (pass 32), a run-time argument on purpose: with a constant 32 --
    a literal, or an omitted default, which numba also compiles as a constant -- LLVM unrolls the inner
    loops completely and leaves them scalar; with a run-time trip count it vectorizes them (4x faster)."""
    n_tok, n_in = x.shape
    xbits = x.view(np.uint32)
    kq = 8 * qk                                                   # Q8_K's 256
    for t in prange(n_tok):
        xr, xir, orow = x[t], xbits[t], out[t]
        if kind == 1:
            for b in range(n_in // qk):   # blocks as slices indexed from 0 (no wraparound checks)
                xb, xi, ob = xr[b * qk:b * qk + qk], xir[b * qk:b * qk + qk], orow[b * qk:b * qk + qk]
                amax = bits_to_f32(_block_absmax_bits(xi))
                d = fp16_to_fp32(fp32_to_fp16(amax / np.float32(127.0)))
                idd = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
                for j in range(qk):
                    ob[j] = np.rint(xb[j] * idd) * d
        else:
            for b in range(n_in // kq):
                xb, xi, ob = xr[b * kq:b * kq + kq], xir[b * kq:b * kq + kq], orow[b * kq:b * kq + kq]
                m = _block_absmax_bits(xi)
                if m == 0:
                    for j in range(kq):
                        ob[j] = 0
                    continue
                mx = np.float32(0.0)
                for j in range(kq):                               # the first element of largest |x|
                    if xi[j] & np.uint32(0x7FFFFFFF) == m:
                        mx = xb[j]
                        break
                iscale = np.float32(-127.0) / mx
                d = np.float32(1.0) / iscale
                for j in range(kq):
                    ob[j] = min(np.float32(127.0), np.rint(iscale * xb[j])) * d


@njit
def round_f16_into(x, out):
    """out = x rounded to fp16 (nearest even), as float32; x and out (n_tok, n) or (n,)."""
    xf, of = x.reshape(-1), out.reshape(-1)
    for i in range(xf.shape[0]):
        of[i] = fp16_to_fp32(fp32_to_fp16(xf[i]))


@njit
def round_bf16_into(x, out):
    """out = x rounded to bf16 (nearest even, ggml's fp32 -> bf16), as float32."""
    xf, of = x.reshape(-1), out.reshape(-1)
    for i in range(xf.shape[0]):
        of[i] = bf16_to_fp32(fp32_to_bf16(xf[i]))


@njit_parallel
def round_half_rows(x, out, bf16):
    """out = x (n_tok, n) rounded to fp16 (bf16 when ``bf16``), as float32; prange over tokens (the
    prefill's F16/BF16 activations; numpy's astype(float16) is a software loop)."""
    for t in prange(x.shape[0]):
        if bf16:
            round_bf16_into(x[t], out[t])
        else:
            round_f16_into(x[t], out[t])


# The batch forms, prange over tokens (one row per iteration: the same bytes for any thread count). They
# live beside the quantizers they call: numba's on-disk cache only watches the file a function is in.

def quantize_rows_body(x, qs, d, s):
    """``QUANT`` (one of the quantizers above) over the rows of x, prange over tokens; built per kind
    below (``ACT_QUANTIZER_ROWS``)."""
    for t in prange(x.shape[0]):
        QUANT(x[t:t + 1], qs[t:t + 1], d[t:t + 1], s[t:t + 1])  # noqa: F821


#: float activation kinds: 'F32' is x itself, 'F16' / 'BF16' x rounded to that type (as float32)
FLOAT_KINDS = {"F32": None, "F16": round_f16_into, "BF16": round_bf16_into}
#: activation kind -> (elements per d: the type's block, from the type table; elements per s: the block for
#: Q8_0 / Q8_1, 16 for Q8_K's bsums)
ACT_LAYOUT = {"Q8_0": (block_size("Q8_0"), block_size("Q8_0")), "Q8_1": (block_size("Q8_1"), block_size("Q8_1")),
              "Q8_K": (block_size("Q8_K"), 16), "F32": (0, 0), "F16": (0, 0), "BF16": (0, 0)}
#: activation kind -> dtype of s (Q8_1 keeps d * sum as float32, the others the integer sums)
ACT_SUM_DTYPE = {"Q8_0": np.int32, "Q8_1": np.float32, "Q8_K": np.int32, "F32": np.int32}
#: activation kind -> the njit quantizer (x, qs, d, s)
ACT_QUANTIZER = {"Q8_0": quantize_q8_0_into, "Q8_1": quantize_q8_1_into, "Q8_K": quantize_q8_k_into}
#: the same, prange over tokens
ACT_QUANTIZER_ROWS = {k: specialize(quantize_rows_body, k, parallel=True, QUANT=f) for k, f in ACT_QUANTIZER.items()}


def empty_activations(kind: str, n_tok: int, n_in: int):
    """Buffers (qs, d, s) for ``kind`` in ACT_LAYOUT (float kinds: qs is float32, d and s are empty)."""
    if kind in FLOAT_KINDS:
        return (np.empty((n_tok, n_in), np.float32), np.empty((n_tok, 0), np.float32),
                np.empty((n_tok, 0), np.int32))
    qd, qsum = ACT_LAYOUT[kind]
    return (np.empty((n_tok, n_in), np.int8), np.empty((n_tok, n_in // qd), np.float32),
            np.empty((n_tok, n_in // qsum), ACT_SUM_DTYPE[kind]))


def quantize_activations(x: np.ndarray, kind: str, bufs=None):
    """float32 (n_tok, n_in) -> (qs, d, s) of ``kind`` ('Q8_0', 'Q8_1', 'Q8_K'; 'F32' = x itself,
    'F16' / 'BF16' = x rounded to that type)."""
    if kind in FLOAT_KINDS:
        xr = x
        if FLOAT_KINDS[kind] is not None:
            xr = np.empty_like(x) if bufs is None else bufs[0]
            FLOAT_KINDS[kind](x, xr)
        return xr, np.empty((x.shape[0], 0), np.float32), np.empty((x.shape[0], 0), np.int32)
    qs, d, s = bufs if bufs is not None else empty_activations(kind, x.shape[0], x.shape[1])
    ACT_QUANTIZER[kind](x, qs, d, s)
    return qs, d, s


def _pack(qs: np.ndarray, qk: int, *fields) -> np.ndarray:
    """Planar fields -> ggml's block bytes (``qk`` quants per block): each field (array, little-endian
    dtype) in block order, converted to that dtype, its bytes per block taken from the array's size."""
    n_tok, n_in = qs.shape
    nb = n_in // qk
    parts = [np.ascontiguousarray(a, dt).view(np.uint8).reshape(n_tok, nb, -1) for a, dt in fields]
    return np.concatenate(parts, axis=2).reshape(n_tok, -1)


def pack_q8_0(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Planar Q8_0 -> ggml's block_q8_0 bytes (n_tok, n_in/32*34): fp16 d, int8 qs[32]."""
    return _pack(qs, block_size("Q8_0"), (d, "<f2"), (qs, "i1"))


def pack_q8_1(qs: np.ndarray, d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Planar Q8_1 -> ggml's block_q8_1 bytes (n_tok, n_in/32*36): fp16 d, fp16 s, int8 qs[32]."""
    return _pack(qs, block_size("Q8_1"), (d, "<f2"), (s, "<f2"), (qs, "i1"))


def pack_q8_k(qs: np.ndarray, d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Planar Q8_K -> ggml's block_q8_K bytes (n_tok, n_in/256*292): f32 d, int8 qs[256], int16 bsums[16]."""
    return _pack(qs, block_size("Q8_K"), (d, "<f4"), (qs, "i1"), (s, "<i2"))
