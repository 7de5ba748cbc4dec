"""``ggml_validate_row_data``: how many NaN/Inf a tensor's bytes hold, without decoding them.

A quantized block decodes to non-finite values exactly when one of its fp16 scales (``d``, and
``dmin``/``m`` where the type has one) is NaN/Inf: the quants are small integers and the products of a
finite fp16 scale with them stay finite in float32. So, like ggml, only the scale fields are read (the
type table's ``checked`` fields, formats/ggml_types.py); for F32/F16/BF16 every value is checked by its
exponent bits.
Both kernels read the bytes once, allocate nothing and count in integers (thread-count independent).
"""

from __future__ import annotations

import numpy as np

from quantkit.errors import QuantError
from quantkit.jit import njit_parallel, prange
from quantkit.formats.ggml_types import type_info
from quantkit.quants.codecs import resolve_type

#: the exponent bits of the float types, as (element dtype, mask); all ones means NaN or Inf
_EXP_MASK = {
    "F32": (np.uint32, 0x7F800000),
    "F16": (np.uint16, 0x7C00),
    "BF16": (np.uint16, 0x7F80),
    "F64": (np.uint64, 0x7FF0000000000000),
}


@njit_parallel
def _count_exp_all_ones(bits, mask):
    """Elements of the 2-D unsigned array ``bits`` whose bits under ``mask`` are all set."""
    m = bits.dtype.type(mask)
    total = 0
    for r in prange(bits.shape[0]):
        row = bits[r]
        c = 0
        for j in range(row.shape[0]):
            c += 1 if (row[j] & m) == m else 0
        total += c
    return total


@njit_parallel
def _count_bad_fields(y, type_size, offsets, width, mask):
    """Blocks of the uint8 rows ``y`` with a bad field at one of ``offsets`` (bytes in the block): a
    little-endian field of ``width`` bytes is bad when all its bits under ``mask`` are set (a NaN/Inf
    fp16 or float32 exponent, an E8M0 0xFF)."""
    nblock = y.shape[1] // type_size
    m = np.uint32(mask)
    total = 0
    for r in prange(y.shape[0]):
        row = y[r]
        c = 0
        for b in range(nblock):
            bad = False
            for k in range(offsets.shape[0]):
                p = b * type_size + offsets[k]
                v = np.uint32(0)
                for i in range(width):
                    v |= np.uint32(row[p + i]) << np.uint32(8 * i)
                bad |= (v & m) == m
            c += 1 if bad else 0
        total += c
    return total


@njit_parallel
def _count_bad_iq1_m(y, type_size, off):
    """IQ1_M blocks whose fp16 scale -- the top nibbles of the four uint16 words of ``scales`` at ``off``,
    as ggml_validate_row_data assembles it -- is NaN/Inf."""
    nblock = y.shape[1] // type_size
    total = 0
    for r in prange(y.shape[0]):
        row = y[r]
        c = 0
        for b in range(nblock):
            p = b * type_size + off
            h = np.uint32(0)
            for k in range(4):
                w = np.uint32(row[p + 2 * k]) | (np.uint32(row[p + 2 * k + 1]) << np.uint32(8))
                h |= ((w >> np.uint32(12)) & np.uint32(0xF)) << np.uint32(4 * k)
            c += 1 if (h & np.uint32(0x7C00)) == np.uint32(0x7C00) else 0
        total += c
    return total


#: ``check`` kind of the type table -> (field width in bytes, the mask whose bits all set mean invalid)
_FIELD_CHECKS = {"f16": (2, 0x7C00), "f32": (4, 0x7F800000), "e8m0": (1, 0xFF)}


def count_invalid(rows: np.ndarray, qtype) -> int:
    """NaN/Inf in uint8 ``rows`` (n_rows, row_bytes) of ``qtype``: values for the float types, blocks
    with a non-finite scale for the quantized ones (the fields the type table's ``checked`` names). 0 means
    ggml_validate_row_data accepts them. Needs only the type table, not a codec."""
    t = resolve_type(qtype)
    try:
        info = type_info(t)
    except KeyError:
        raise QuantError(f"unknown quantization type {qtype!r}") from None
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.ndim == 0 or rows.shape[-1] % info.type_size:
        raise QuantError(f"{info.name}: expected uint8 rows of whole {info.type_size}-byte blocks, got "
                         f"{rows.dtype} {rows.shape}")
    rows = rows.reshape(-1, rows.shape[-1])
    if not rows.size or info.check == "none":
        return 0
    if info.check == "values":
        dtype, mask = _EXP_MASK[info.name]
        return int(_count_exp_all_ones(rows.view(dtype), mask))
    if info.check == "iq1_m":
        return int(_count_bad_iq1_m(rows, info.type_size, info.field("scales")))
    width, mask = _FIELD_CHECKS[info.check]
    return int(_count_bad_fields(rows, info.type_size, np.asarray(info.check_offsets, dtype=np.int64), width, mask))
