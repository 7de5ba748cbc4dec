"""Activation quantizers: float32 rows -> the vec_dot type, as ggml's CPU ``from_float`` reference.

We keep quantized activations *planar* -- three arrays instead of ggml's interleaved blocks -- so the
dot kernels read 32 contiguous int8 per block and the per-block integer sums are at hand:

* ``qs`` int8  (n_tok, n_in)        the quants
* ``d``  float32 (n_tok, n_in/QK)   the block scale (Q8_0/Q8_1: the fp16-rounded value ggml stores;
  Q8_K: the float32 ``d``)
* ``s``  (n_tok, n_in/G)            per group of G: Q8_0: int32 sum of qs (G = 32); Q8_1: float32
  ``d * sum(qs)`` (ggml's ``s``, in float32 instead of fp16); Q8_K: int32 ``bsums`` (G = 16)

Rounding follows ggml's ``quantize_row_q8_0_ref`` / ``_q8_1_ref`` (``roundf``: half away from zero)
and ``quantize_row_q8_K_ref`` (``nearest_int``: half to even, ``iscale = -127/max``).
``pack_q8_0`` / ``pack_q8_k`` write ggml's block bytes, for tests and interchange.
"""

from __future__ import annotations

import numpy as np

from quantkit.jit import njit
from quantkit.quants.common import fp16_to_fp32, fp32_to_fp16, nearest_int


@njit
def _roundf(v):
    """C roundf on float32: half away from zero, exact (no x + 0.5 double rounding)."""
    a = np.abs(v)
    r = np.floor(a)
    if a - r >= np.float32(0.5):
        r += np.float32(1.0)
    return -r if v < 0 else r


@njit
def quantize_q8_0_into(x, qs, d, s):
    """x float32 (n_tok, n_in) -> qs int8 (n_tok, n_in), d float32 (n_tok, n_in/32), s int32 (same).
    Also Q8_1's quantizer: the two share ggml's reference rounding and differ only in what is stored."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        xr = x[t]
        qr = qs[t]
        for b in range(n_in // 32):
            o = b * 32
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, np.abs(xr[o + j]))
            dd = amax / np.float32(127.0)
            idd = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)
            tot = 0
            for j in range(32):
                q = np.int32(_roundf(xr[o + j] * idd))
                qr[o + j] = q
                tot += q
            d[t, b] = fp16_to_fp32(fp32_to_fp16(dd))
            s[t, b] = tot


@njit
def quantize_q8_1_into(x, qs, d, s):
    """Q8_1: the quants and scales of Q8_0, and s float32 (n_tok, n_in/32) = d * sum(qs) (ggml's
    ``s``, kept in float32 from the stored d) -- the Q4_1/Q5_1 min term needs exactly that."""
    n_tok, n_in = x.shape
    tmp = np.empty((n_tok, n_in // 32), np.int32)
    quantize_q8_0_into(x, qs, d, tmp)
    for t in range(n_tok):
        for b in range(n_in // 32):
            s[t, b] = d[t, b] * np.float32(tmp[t, b])


@njit
def quantize_q8_k_into(x, qs, d, s):
    """x float32 (n_tok, n_in) -> qs int8 (n_tok, n_in), d float32 (n_tok, n_in/256),
    s int32 (n_tok, n_in/16) = ggml's bsums."""
    n_tok, n_in = x.shape
    for t in range(n_tok):
        xr = x[t]
        qr = qs[t]
        for b in range(n_in // 256):
            o = b * 256
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(256):
                ax = np.abs(xr[o + j])
                if ax > amax:
                    amax = ax
                    mx = xr[o + j]
            if amax == 0:
                d[t, b] = 0
                for j in range(256):
                    qr[o + j] = 0
                for g in range(16):
                    s[t, b * 16 + g] = 0
                continue
            iscale = np.float32(-127.0) / mx
            for j in range(256):
                qr[o + j] = min(127, nearest_int(iscale * xr[o + j]))
            for g in range(16):
                tot = 0
                for j in range(16):
                    tot += qr[o + 16 * g + j]
                s[t, b * 16 + g] = tot
            d[t, b] = np.float32(1.0) / iscale





#: activation kind -> (elements per d, elements per s)
ACT_LAYOUT = {"Q8_0": (32, 32), "Q8_1": (32, 32), "Q8_K": (256, 16), "F32": (0, 0)}
#: activation kind -> dtype of s (Q8_1 keeps d * sum as float32, the others the integer sums)
ACT_SUM_DTYPE = {"Q8_0": np.int32, "Q8_1": np.float32, "Q8_K": np.int32, "F32": np.int32}
#: activation kind -> the njit quantizer (x, qs, d, s)
ACT_QUANTIZER = {"Q8_0": quantize_q8_0_into, "Q8_1": quantize_q8_1_into, "Q8_K": quantize_q8_k_into}


def empty_activations(kind: str, n_tok: int, n_in: int):
    """Buffers (qs, d, s) for ``kind`` in ACT_LAYOUT ('F32': qs is float32, d and s are empty)."""
    if kind == "F32":
        return (np.empty((n_tok, n_in), np.float32), np.empty((n_tok, 0), np.float32),
                np.empty((n_tok, 0), np.int32))
    qd, qsum = ACT_LAYOUT[kind]
    return (np.empty((n_tok, n_in), np.int8), np.empty((n_tok, n_in // qd), np.float32),
            np.empty((n_tok, n_in // qsum), ACT_SUM_DTYPE[kind]))


def quantize_activations(x: np.ndarray, kind: str, bufs=None):
    """float32 (n_tok, n_in) -> (qs, d, s) of ``kind`` ('Q8_0', 'Q8_1', 'Q8_K' or 'F32' = x itself)."""
    if kind == "F32":
        return x, np.empty((x.shape[0], 0), np.float32), np.empty((x.shape[0], 0), np.int32)
    qs, d, s = bufs if bufs is not None else empty_activations(kind, x.shape[0], x.shape[1])
    ACT_QUANTIZER[kind](x, qs, d, s)
    return qs, d, s


def pack_q8_0(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Planar Q8_0 -> ggml's block_q8_0 bytes (n_tok, n_in/32*34)."""
    n_tok, n_in = qs.shape
    nb = n_in // 32
    out = np.empty((n_tok, nb, 34), np.uint8)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(n_tok, nb, 2)
    out[:, :, 2:] = qs.view(np.uint8).reshape(n_tok, nb, 32)
    return out.reshape(n_tok, nb * 34)


def pack_q8_k(qs: np.ndarray, d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Planar Q8_K -> ggml's block_q8_K bytes (n_tok, n_in/256*292): f32 d, int8 qs[256], int16 bsums[16]."""
    n_tok, n_in = qs.shape
    nb = n_in // 256
    out = np.empty((n_tok, nb, 292), np.uint8)
    out[:, :, :4] = d.astype("<f4").view(np.uint8).reshape(n_tok, nb, 4)
    out[:, :, 4:260] = qs.view(np.uint8).reshape(n_tok, nb, 256)
    out[:, :, 260:] = s.astype("<i2").view(np.uint8).reshape(n_tok, nb, 32)
    return out.reshape(n_tok, nb * 292)
