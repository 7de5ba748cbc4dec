"""Kernels: activation quantization, block dot products, GEMV/GEMM over GGUF weight bytes.

Public API (see docs/kernels.md):

* ``matmul(w, wtype, x, out=None)`` -- float32 (n_tok, n_out) = x @ dequantize(w).T
* ``get_rows(w, wtype, ids)``       -- embedding lookup, dequantizing only the rows asked for
* ``set_threads(n)``                -- numba's worker count (BLAS is limited to it in ``matmul``)
* ``blas_limit()``                  -- context manager limiting BLAS to that count for a caller's products
* ``VEC_DOT_TYPE``                  -- weight type -> the activation type ggml's CPU backend uses (type table)
* ``WEIGHT_TYPES``                  -- the types with a fast row dot (their record's row entry, cpu_traits.py)
* ``matvec_kernel(wtype)`` -> ``matvec(w, xq, xd, xs, out, chunk)`` (the type's row runner bound to
  the generic GEMV, runners.py);
  ``matvec_x8_kernel(wtype)`` the same for weights in the 8-row interleaved layout (``pack_x8``, the
  types ``x8_types()``: those whose record has an x8 entry, on the levels that build it; cpu_traits.py);
  ``quantize_activations`` / ``empty_activations`` and ``activation_kind(wtype)`` for its inputs.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

from quantkit.formats.ggml_types import TYPES
from quantkit.jit import get_threads, set_threads
from quantkit.kernels.activations import (empty_activations, pack_q8_0, pack_q8_1, pack_q8_k, quantize_activations,
                                          quantize_q8_01_into, quantize_q8_0_into, quantize_q8_1_into,
                                          quantize_q8_k_into)
from quantkit.kernels.ir import HAS_F16, HAS_VNNI, RUNNABLE_VARIANTS, VARIANTS, default_variant
from quantkit.kernels.mul_mat import CHUNK_ROWS, GEMM_MIN_TOKENS, PREFILL_MIN_TOKENS, TILE_ROWS, blas_limit, get_rows, matmul
from quantkit.kernels.runners import gemv_kernel, matvec_kernel, matvec_x8_kernel
from quantkit.kernels.vecdot import WEIGHT_TYPES, activation_kind, deq_kernel, pack_x8, rowdot_kernel, x8_types

#: ggml-cpu's type_traits_cpu[...].vec_dot_type (the type table's): what the activations are converted to.
#: quantkit follows it: for F16 / BF16 weights the float32 activations are rounded to that type in the row dot.
VEC_DOT_TYPE = {T(t.id): T[t.vec_dot_type] for t in TYPES if t.vec_dot_type and t.gguf_type is not None}

__all__ = [
    "CHUNK_ROWS", "GEMM_MIN_TOKENS", "HAS_F16", "HAS_VNNI", "PREFILL_MIN_TOKENS", "RUNNABLE_VARIANTS", "TILE_ROWS", "VARIANTS", "VEC_DOT_TYPE",
    "WEIGHT_TYPES", "activation_kind", "default_variant", "deq_kernel", "empty_activations", "get_rows",
    "get_threads", "matmul", "matvec_kernel", "pack_q8_0", "pack_q8_1", "pack_q8_k", "quantize_activations",
    "quantize_q8_01_into", "quantize_q8_0_into", "quantize_q8_1_into", "quantize_q8_k_into", "rowdot_kernel", "set_threads",
    "gemv_kernel", "blas_limit", "matvec_x8_kernel", "pack_x8", "x8_types",
]
