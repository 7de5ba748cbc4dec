"""The codecs' base: one small class per ggml type, a subclass of ``QuantType`` naming its ``qtype``.

The base class does, once for every type, what gguf-py's ``__Quant`` does: shape and dtype checks,
rows-to-blocks bookkeeping and the byte shape. A subclass only names its numba kernels:

* ``quantize_row_ref(x, y)``  -- ggml's ``quantize_row_X_ref`` for one row: float32[n_per_row] ->
  uint8[row_bytes], the path without importance weights (``quant_weights == NULL``);
* ``quantize_row_impl(x, y, qw)`` -- ggml's weighted ``quantize_row_X_impl`` for one row (``qw`` float32
  [n_per_row]), for a type whose bytes depend on the weights;
* or ``quantize_row(x, y, qw)`` -- one function for both paths, ``qw`` empty for the reference one.
  A function several types share is one plain-Python body naming their differences as globals
  (``NMAX``, ``TS``, ...) and built per type with ``build_kernel`` (``jit.specialize``), so each build
  sees them as literals (LLVM unrolls and vectorizes as it did per-type copies; passed as arguments they
  cost the shared legacy row quantizer up to 1.5x). The base builds ``quantize_rows(x, y, qw)`` from
  them: a serial loop over a range of rows, run in chunks on the worker threads (``jit.over_rows``),
  each row independent, so the bytes never depend on the thread count (a codec may give its own instead);
* ``dequantize_row(src, y)``   -- ggml's ``dequantize_row_X`` for one row: uint8[row_bytes] ->
  float32[n_per_row], serial ``@njit``. It is *the* row decoder of the type: the kernels call it too
  (embedding rows, the prefill's tiles, the portable GEMV), so there is one copy. A type whose decoder
  works block by block gives ``dequantize_block(src, y)`` (one block's bytes -> its values) instead and
  the base loops it over a row; a decoder several types share is built per type as above.
  ``dequantize_rows`` (over rows on the worker threads, as ``quantize_rows``) is built from the row decoder.

A type's sizes, block fields and the rest of its facts come from the type table
(``quantkit.formats.ggml_types``), not from the codec. Defining a subclass registers nothing: the codec
column of the type table (``quants/codecs.py``'s ``TRAITS``: ``GGMLQuantizationType`` -> class) names
each type's codec; dispatch goes through it, never through if-chains.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np
from gguf import GGMLQuantizationType

from quantkit.errors import QuantError
from quantkit.formats.ggml_types import TypeInfo, type_info
from quantkit.jit import frozen, over_rows, specialize

#: no weights; weights are passed read-only (``jit.frozen``: one build of a codec's kernel for both paths)
_EMPTY_W = frozen(np.zeros(0, dtype=np.float32))


def build_kernel(body: Callable, qtype: GGMLQuantizationType, parallel: bool, **names) -> Callable:
    """``body`` compiled for one type, its placeholder globals bound to ``names`` (``jit.specialize``)."""
    return specialize(body, qtype.name, parallel=parallel, **names)


def _dequantize_rows_body(y, x, r0, r1):
    """x[r] = the decoded y[r] for rows r0..r1-1 (``ROW``: a type's ``dequantize_row``)."""
    for r in range(r0, r1):
        ROW(y[r], x[r])  # noqa: F821


def _dequantize_row_body(src, y):
    """A row decoded block by block (``BLOCK``: a type's ``dequantize_block``; ``QK`` values from ``TS``
    bytes each)."""
    for i in range(y.shape[0] // QK):  # noqa: F821
        BLOCK(src[TS * i:TS * (i + 1)], y[QK * i:QK * (i + 1)])  # noqa: F821


def _quantize_rows_body(x, y, qw, r0, r1):
    """Rows r0..r1-1 by ``REF`` (no weights) or ``IMPL`` (weights ``qw``)."""
    for r in range(r0, r1):
        if qw.shape[0] == 0:
            REF(x[r], y[r])  # noqa: F821
        else:
            IMPL(x[r], y[r], qw)  # noqa: F821


def _quantize_rows_ref_body(x, y, qw, r0, r1):
    """Rows r0..r1-1 by ``REF``, for a type whose bytes ignore the weights."""
    for r in range(r0, r1):
        REF(x[r], y[r])  # noqa: F821


def _quantize_rows_one_body(x, y, qw, r0, r1):
    """Rows r0..r1-1 by ``ROW``, one function for both paths."""
    for r in range(r0, r1):
        ROW(x[r], y[r], qw)  # noqa: F821


def _build_kernels(cls) -> None:
    """The kernels a codec did not give itself, from the row and block functions it did."""
    q = cls.qtype
    # what the class or a shared base below QuantType gives (a built kernel is set on its own class)
    d = {k for c in cls.__mro__[:cls.__mro__.index(QuantType)] for k in c.__dict__}
    if "dequantize_row" not in d and "dequantize_block" in d:
        cls.dequantize_row = build_kernel(_dequantize_row_body, q, False, BLOCK=cls.dequantize_block,
                                          QK=cls.block_size, TS=cls.type_size)
    if "dequantize_rows" not in d:
        cls.dequantize_rows = _on_threads(build_kernel(_dequantize_rows_body, q, False, ROW=cls.dequantize_row))
    if "quantize_rows" in d:
        return
    if "quantize_row" in d:
        rows = build_kernel(_quantize_rows_one_body, q, False, ROW=cls.quantize_row)
    elif "quantize_row_impl" in d:
        rows = build_kernel(_quantize_rows_body, q, False, REF=cls.quantize_row_ref, IMPL=cls.quantize_row_impl)
    else:
        rows = build_kernel(_quantize_rows_ref_body, q, False, REF=cls.quantize_row_ref)
    cls.quantize_rows = _on_threads(rows)


def _on_threads(kernel: Callable) -> staticmethod:
    """``f(a, b, *rest)`` running the serial row-range ``kernel(a, b, *rest, r0, r1)`` over a's rows on
    the worker threads (``jit.over_rows``: no ``prange`` build to compile)."""
    def rows(a, b, *rest):
        over_rows(kernel, a.shape[0], a, b, *rest)
    rows.kernel = kernel
    return staticmethod(rows)


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
    #: what ``quantize_rows`` is built from unless given (module docstring)
    quantize_row_ref: ClassVar[Callable]
    quantize_row_impl: ClassVar[Callable]
    quantize_row: ClassVar[Callable]
    dequantize_row: ClassVar[Callable]
    dequantize_block: ClassVar[Callable]
    dequantize_rows: ClassVar[Callable]

    def __init_subclass__(cls, qtype: GGMLQuantizationType | None = None) -> None:
        if qtype is None:  # a base that types sharing their kernels derive from
            return
        cls.qtype = qtype
        cls.info = type_info(qtype)
        cls.block_size, cls.type_size = cls.info.block_size, cls.info.type_size
        _build_kernels(cls)

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
                cls.quantize_rows(rows, out, frozen(w))
            else:  # one row of weights per expert (leading dimension of data)
                per = rows.shape[0] // w.shape[0]
                for e in range(w.shape[0]):
                    cls.quantize_rows(rows[e * per:(e + 1) * per], out[e * per:(e + 1) * per], frozen(w[e]))
        return out.reshape(*data.shape[:-1], out.shape[-1])

    @classmethod
    def quantize_into(cls, rows: np.ndarray, out: np.ndarray, weights: np.ndarray | None = None) -> None:
        """``quantize`` without its checks and allocation, for a caller streaming a tensor slab by slab that
        has already checked ``rows`` (float32, C-contiguous (n, n_per_row), finite) and ``weights``
        (float32 (n_per_row,) or None) and owns ``out`` (uint8 (n, row_bytes))."""
        if weights is None:
            cls._check_needs_imatrix()
        cls.quantize_rows(rows, out, _EMPTY_W if weights is None or not cls.uses_imatrix else frozen(weights))

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
        rows = frozen(np.ascontiguousarray(data.reshape(-1, row_bytes)))
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

