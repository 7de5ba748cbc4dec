"""The type registry: one small class per ggml type, registered by subclassing ``QuantType``.

The base class does, once for every type, what gguf-py's ``__Quant`` does: shape and dtype checks,
rows-to-blocks bookkeeping and the byte shape. A subclass only names its numba kernels:

* ``quantize_rows(x, y, qw)``  -- x float32[nrow, n_per_row], y uint8[nrow, row_bytes],
  qw float32[n_per_row] importance weights, or an empty array for ggml's reference path
  (``quant_weights == NULL``). Parallel over rows with ``prange``; each row independent, so the
  bytes never depend on the thread count.
* ``dequantize_row(src, y)``   -- ggml's ``dequantize_row_X`` for one row: uint8[row_bytes] ->
  float32[n_per_row], serial ``@njit``. It is *the* row decoder of the type: the kernels call it too
  (embedding rows, the prefill's tiles, the portable GEMV), so there is one copy. ``dequantize_rows``
  (parallel over rows) is built from it unless a codec gives its own.

A type's sizes, block fields and the rest of its facts come from the type table
(``quantkit.formats.ggml_types``), not from the codec. The traits table (``TRAITS``) maps
``GGMLQuantizationType`` -> class; dispatch goes through it, never through if-chains.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np
import os
from gguf import GGMLQuantizationType

from quantkit.errors import QuantError
from quantkit.formats.ggml_types import TypeInfo, type_info
from quantkit.jit import prange, source_digest, specialize

TRAITS: dict[GGMLQuantizationType, type["QuantType"]] = {}

_EMPTY_W = np.zeros(0, dtype=np.float32)


def resolve_type(qtype: GGMLQuantizationType | str | int) -> GGMLQuantizationType:
    """Accept a GGMLQuantizationType, its name (any case, e.g. ``"q4_k"``) or its integer id."""
    if isinstance(qtype, GGMLQuantizationType):
        return qtype
    if isinstance(qtype, str):
        key = qtype.strip().upper()
        try:
            return GGMLQuantizationType[key]
        except KeyError:
            pass
        raise QuantError(f"unknown quantization type {qtype!r}; known: {', '.join(t.name for t in TRAITS)}")
    try:
        return GGMLQuantizationType(int(qtype))
    except (ValueError, TypeError):
        raise QuantError(f"unknown quantization type id {qtype!r}") from None


def traits(qtype: GGMLQuantizationType | str | int) -> type["QuantType"]:
    t = resolve_type(qtype)
    try:
        return TRAITS[t]
    except KeyError:
        raise QuantError(
            f"type {t.name} is not supported by quantkit; supported: {', '.join(x.name for x in TRAITS)}"
        ) from None


def _rows_body(y, x):
    """x[r] = the decoded y[r] for every row (``ROW``: a type's ``dequantize_row``); prange over rows."""
    for r in prange(y.shape[0]):
        ROW(y[r], x[r])  # noqa: F821


def _rows_kernel(qtype: GGMLQuantizationType, row: Callable) -> Callable:
    """``dequantize_rows`` built from a type's row decoder; its name carries a digest of the decoder's file
    and of quants/common.py (numba's cache watches only this file)."""
    files = [row.py_func.__code__.co_filename, os.path.join(os.path.dirname(__file__), "common.py")]
    return specialize(_rows_body, f"{qtype.name}_{source_digest(*files)}", parallel=True, ROW=row)


class QuantType:
    qtype: ClassVar[GGMLQuantizationType]
    #: the type's row in the type table (sizes, block fields, validation, vec_dot type)
    info: ClassVar[TypeInfo]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    #: whether an importance matrix changes the bytes (ggml's quantize_X uses quant_weights)
    uses_imatrix: ClassVar[bool] = True
    #: ggml_quantize_requires_imatrix: ggml_quantize_chunk asserts on a NULL imatrix for this type
    requires_imatrix: ClassVar[bool] = False
    quantize_rows: ClassVar[Callable]
    dequantize_row: ClassVar[Callable]
    dequantize_rows: ClassVar[Callable]

    def __init_subclass__(cls, qtype: GGMLQuantizationType) -> None:
        cls.qtype = qtype
        cls.info = type_info(qtype)
        cls.block_size, cls.type_size = cls.info.block_size, cls.info.type_size
        if "dequantize_rows" not in cls.__dict__:
            cls.dequantize_rows = _rows_kernel(qtype, cls.dequantize_row)
        TRAITS[qtype] = cls

    # -- sizes -------------------------------------------------------------------------------
    @classmethod
    def row_bytes(cls, n_per_row: int) -> int:
        cls.check_row(n_per_row)
        return n_per_row // cls.block_size * cls.type_size

    @classmethod
    def nbytes(cls, shape_ne: tuple[int, ...]) -> int:
        """Bytes of a tensor with GGUF shape (ne0 first)."""
        n = 1
        for d in shape_ne[1:]:
            n *= int(d)
        return n * cls.row_bytes(int(shape_ne[0]))

    @classmethod
    def check_row(cls, n_per_row: int) -> None:
        if n_per_row <= 0 or n_per_row % cls.block_size:
            raise QuantError(
                f"{cls.qtype.name}: row length {n_per_row} is not a positive multiple of the block size "
                f"{cls.block_size}"
            )

    # -- public ------------------------------------------------------------------------------
    @classmethod
    def quantize(cls, data: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        data = np.asarray(data)
        name = cls.qtype.name
        if data.dtype != np.float32:
            raise QuantError(f"{name}: data must be float32, got {data.dtype}")
        if data.ndim == 0:
            raise QuantError(f"{name}: data must have at least one dimension")
        n_per_row = int(data.shape[-1])
        cls.check_row(n_per_row)
        bad = data.size - int(np.count_nonzero(np.isfinite(data)))
        if bad:
            raise QuantError(f"{name}: data of shape {data.shape} has {bad} NaN/Inf value(s)")
        rows = np.ascontiguousarray(data.reshape(-1, n_per_row))
        out = np.empty((rows.shape[0], n_per_row // cls.block_size * cls.type_size), dtype=np.uint8)
        if rows.shape[0] == 0:
            return out.reshape(*data.shape[:-1], out.shape[-1])
        # a bad imatrix is the user's mistake even for a type whose bytes ignore it
        w = None if imatrix is None else cls._check_imatrix(imatrix, data.shape)
        if w is None:
            cls._check_needs_imatrix()
        if w is None or not cls.uses_imatrix:
            cls.quantize_rows(rows, out, _EMPTY_W)
        else:
            if w.ndim == 1:
                cls.quantize_rows(rows, out, w)
            else:  # one row of weights per expert (leading dimension of data)
                per = rows.shape[0] // w.shape[0]
                for e in range(w.shape[0]):
                    cls.quantize_rows(rows[e * per:(e + 1) * per], out[e * per:(e + 1) * per], w[e])
        return out.reshape(*data.shape[:-1], out.shape[-1])

    @classmethod
    def quantize_into(cls, rows: np.ndarray, out: np.ndarray, weights: np.ndarray | None = None) -> None:
        """``quantize`` without its checks and allocation, for a caller streaming a tensor slab by slab that
        has already checked ``rows`` (float32, C-contiguous (n, n_per_row), finite) and ``weights``
        (float32 (n_per_row,) or None) and owns ``out`` (uint8 (n, row_bytes))."""
        if weights is None:
            cls._check_needs_imatrix()
        cls.quantize_rows(rows, out, _EMPTY_W if weights is None or not cls.uses_imatrix else weights)

    @classmethod
    def _check_needs_imatrix(cls) -> None:
        if cls.requires_imatrix:
            raise QuantError(f"{cls.qtype.name}: quantizing to this type needs an importance matrix "
                             f"(ggml refuses without one)")

    @classmethod
    def dequantize_into(cls, data: np.ndarray, out: np.ndarray) -> None:
        """``dequantize`` of uint8 rows (n, row_bytes) into the caller's float32 (n, n_per_row)."""
        cls.dequantize_rows(data, out)

    @classmethod
    def dequantize(cls, data: np.ndarray) -> np.ndarray:
        data = np.asarray(data)
        name = cls.qtype.name
        if data.dtype != np.uint8:
            if data.ndim == 0:
                raise QuantError(f"{name}: data must have at least one dimension")
            data = np.ascontiguousarray(data).view(np.uint8)
        if data.ndim == 0 or data.shape[-1] % cls.type_size:
            raise QuantError(
                f"{name}: {data.shape[-1] if data.ndim else 0} bytes per row is not a multiple of the "
                f"{cls.type_size}-byte block"
            )
        row_bytes = int(data.shape[-1])
        n_per_row = row_bytes // cls.type_size * cls.block_size
        rows = np.ascontiguousarray(data.reshape(-1, row_bytes))
        out = np.empty((rows.shape[0], n_per_row), dtype=np.float32)
        if rows.shape[0]:
            cls.dequantize_rows(rows, out)
        return out.reshape(*data.shape[:-1], n_per_row)

    @classmethod
    def _check_imatrix(cls, imatrix, data_shape) -> np.ndarray:
        name = cls.qtype.name
        w = np.asarray(imatrix)
        n = data_shape[-1]
        if w.dtype != np.float32:
            if not np.issubdtype(w.dtype, np.floating):
                raise QuantError(f"{name}: imatrix must be float32, got {w.dtype}")
            w = w.astype(np.float32)
        if w.ndim == 1:
            if w.shape[0] != n:
                raise QuantError(f"{name}: imatrix has {w.shape[0]} values but rows have {n} columns")
        elif w.ndim == 2:
            if w.shape[1] != n or len(data_shape) < 2 or data_shape[0] != w.shape[0]:
                raise QuantError(
                    f"{name}: imatrix of shape {w.shape} does not fit data of shape {tuple(data_shape)} "
                    f"(want (n_expert, {n}) with n_expert = data.shape[0])"
                )
        else:
            raise QuantError(f"{name}: imatrix must be 1-D (n_per_row) or 2-D (n_expert, n_per_row)")
        if not np.isfinite(w).all():
            raise QuantError(f"{name}: imatrix contains non-finite values")
        if (w < 0).any():
            raise QuantError(f"{name}: imatrix contains negative values")
        return np.ascontiguousarray(w)


def quantize(data: np.ndarray, qtype, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize float32 ``data`` of shape (..., n_per_row) to ``qtype``; returns uint8 (..., row_bytes).

    Bytes are identical to ggml's ``ggml_quantize_chunk`` with ``quant_weights`` NULL
    (``imatrix=None``) or set to ``imatrix``.
    """
    return traits(qtype).quantize(data, imatrix)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """Dequantize bytes of shape (..., row_bytes) of ``qtype`` to float32 (..., n_per_row)."""
    return traits(qtype).dequantize(data)
