"""Row dots (one weight row . one token's quantized activations), the x8 layout, the row decoders' kernels.

Each ``rowdot_X(wr, xq, xd, xs, sc) -> float32`` takes one weight row's bytes ``wr`` (1-D uint8), one
token's planar activations (``xq`` int8 quants, ``xd`` float32 block scales, ``xs`` int32 group
sums; see activations.py) and a 16-int32 scratch ``sc`` (kept so that every row dot has one signature;
no body reads it). A quantized row is one IR intrinsic for the whole row (``ROW``: ir_rowdot.row_dot
around the type's per-block emitter, its record's row entry in cpu_traits.py): the weight unpacking,
the integer dots, the fp16 scales, the mins / offsets (through the activation sums) and the float
accumulate, one float multiply-add per block as ggml's ``vec_dot_X_Y``. The float types' rows and the
portable path (``rowdot_deq``: a row decoded by its codec) are numba code.

The bodies are written once and *built* per variant: ``build(fn, variant, ...)`` copies a body with
the variant's intrinsics in its globals and compiles it -- the umap habit of one body, several
builds (vnni / avx2 / neon / generic), so they can be compared in tests. The GEMV over them is
runners.py's: a type's row dots in a C-callable row runner, one generic GEMV body for every type.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.formats.ggml_types import type_info
from quantkit.jit import prange, specialize
from quantkit.kernels.cpu_traits import CPU_TRAITS, cpu_traits
from quantkit.kernels.ir import default_variant
from quantkit.kernels.ir_rowdot import row_dot
from quantkit.kernels.ir_x8 import X8_ROWS, row_dot_x8, x8_flavour, x8_places
from quantkit.quants import traits

F = np.float32
#: float rows a float row dot takes at once (``rowdot8_float``), each activation loaded once for all of
#: them: 1B-shape F16 tg32 on Sapphire Rapids (avx512vnni, 2 threads) 8.6 t/s a row at a time, 10.5-10.6
#: four or eight at a time; SmolLM2 F16 ~51 a row or four at a time, 55-56 eight (docs/performance-history.md,
#: "Float decode, four rows a call")
FLOAT_ROWS = 8


def rowdot_ir(wr, xq, xd, xs, sc):
    """A quantized row: one IR intrinsic (``row_intrinsic``) does the whole row."""
    return ROW(wr, xq, xd, xs)  # noqa: F821


def rowdot2_ir(wr, xq, xd, xs, sc):
    """Two consecutive quantized rows (``wr`` holds both): one IR loop sharing the activation loads,
    each row's sum bit-identical to ``rowdot_ir``'s. -> (float32, float32)"""
    return ROW2(wr, xq, xd, xs)  # noqa: F821


def rowdot2_split(wr, xq, xd, xs, sc):
    """Two consecutive rows with the 1-row dot (the portable path's decoded rows)."""
    n = wr.shape[0] // 2
    return ROWDOT(wr[:n], xq, xd, xs, sc), ROWDOT(wr[n:], xq, xd, xs, sc)  # noqa: F821


# -- unquantized weights: float32 activations (xq is the float32 row; xd, xs unused) ---------------

def rowdot_float(wr, xq, xd, xs, sc):
    """F32 / F16 / BF16 weights (``LD``: the type's ``Row`` load, ``ld_f32`` / ``ld_f16`` / ``ld_bf16``;
    ``ES`` bytes a weight, its type size); ``xq`` is the float32 row, already rounded to fp16 / bf16 for
    those (kinds 'F16' / 'BF16': ggml's vec_dot_type of each). No software prefetch: it prefetched the next row's cache lines until
    2026-12-06, measured 10-25 % faster on the Sapphire Rapids machine with the code of 2026-12-01, but
    18-33 % slower F16 decode on a Zen 4 with today's (docs/performance-history.md, "The other types
    on Zen 4"); the hardware prefetchers follow the rows' one ascending stream."""
    acc = F(0.0)
    for j in range(xq.shape[0]):
        acc += LD(wr, ES * j) * xq[j]  # noqa: F821
    return acc


def rowdot8_float(wr, xq, xd, xs, sc):
    """``FLOAT_ROWS`` (8) consecutive float rows (``wr`` holds them), each activation loaded once for all
    eight, as llama.cpp's tinyBLAS tiles several rows over one column. -> 8 x float32"""
    n = wr.shape[0] // 8
    a0, a1, a2, a3, a4, a5, a6, a7 = F(0.0), F(0.0), F(0.0), F(0.0), F(0.0), F(0.0), F(0.0), F(0.0)
    for j in range(xq.shape[0]):
        x = xq[j]
        o = ES * j  # noqa: F821
        a0 += LD(wr, o) * x  # noqa: F821
        a1 += LD(wr, n + o) * x  # noqa: F821
        a2 += LD(wr, 2 * n + o) * x  # noqa: F821
        a3 += LD(wr, 3 * n + o) * x  # noqa: F821
        a4 += LD(wr, 4 * n + o) * x  # noqa: F821
        a5 += LD(wr, 5 * n + o) * x  # noqa: F821
        a6 += LD(wr, 6 * n + o) * x  # noqa: F821
        a7 += LD(wr, 7 * n + o) * x  # noqa: F821
    return a0, a1, a2, a3, a4, a5, a6, a7


# -- a type with a codec but no integer dot: the portable path ---------------------------------------

def rowdot_deq(wr, xq, xd, xs, sc):
    """The row decoded one block at a time (``DEQ``: the codec's ``dequantize_row``; ``TS`` bytes ->
    ``BS`` values) and dotted with float32 activations (kind 'F32'). Slower than an integer dot, but any
    type with a codec runs in run / perplexity / bench / imatrix."""
    buf = np.empty(BS, np.float32)  # noqa: F821
    acc = F(0.0)
    for b in range(wr.shape[0] // TS):  # noqa: F821
        DEQ(wr[b * TS:(b + 1) * TS], buf)  # noqa: F821
        x = xq[b * BS:(b + 1) * BS]  # noqa: F821
        for j in range(buf.shape[0]):
            acc += buf[j] * x[j]
    return acc


# -- dequantized rows (the prefill's tiles, the embedding lookup) ----------------------------------

def deq_rows_body(w, r0, tile):
    """tile[i] = dequantized w[r0 + i]; prange over rows."""
    for i in prange(tile.shape[0]):
        DEQ(w[r0 + i], tile[i])  # noqa: F821


def get_rows_body(w, ids, out):
    for i in prange(ids.shape[0]):
        DEQ(w[ids[i]], out[i])  # noqa: F821


# -- building a type's entries (its record's kernel columns: kernels/cpu_traits.py) ------------------

#: every weight type with a fast (integer or float) row dot; any other type with a codec runs on the portable
#: path (its row decoder and a float32 dot)
WEIGHT_TYPES = tuple(T[n] for n, c in CPU_TRAITS.items() if c.row is not None)

_DOTS: dict[tuple, object] = {}


def row_intrinsic(wtype, variant: str, nrows: int = 1):
    """The ``ROW`` intrinsic of ``wtype``'s row-dot entry for an IR variant: ir_rowdot.py's whole-row loop
    around its emitter (``nrows`` rows sharing the activation loads), or its own row loop (1 row)."""
    t = T(wtype)
    key = (t, variant, nrows)
    if key not in _DOTS:
        row = cpu_traits(t).row
        if row.kind == "ir":
            _DOTS[key] = row_dot(variant, t.name, row.fn, nrows)
        elif row.kind == "loop" and nrows == 1:
            _DOTS[key] = row.fn(variant)
        else:
            raise ValueError(f"no {nrows}-row IR dot for {t.name}")
    return _DOTS[key]


def build(fn, tag: str, parallel: bool, **names):
    """``jit.specialize`` for the kernels: fastmath (the name carries the digest of what they are built from)."""
    return specialize(fn, tag, parallel=parallel, fast=True, **names)


def activation_kind(wtype, variant: str | None = None) -> str:
    """What ``matvec_kernel(wtype, variant)`` expects as activations: 'Q8_0', 'Q8_1', 'Q8_K', or the float
    kinds 'F32', 'F16', 'BF16' (float32 rows, the last two rounded to that type; see activations.py)."""
    variant = variant or default_variant()
    t = T(wtype)
    deq_kernel(t)  # a type without a codec: one line (QuantError), here, before any compute
    if variant == "plain" or cpu_traits(t).row is None:
        return "F32"
    return type_info(t).vec_dot_type


def rowdot_kernel(wtype, variant: str | None = None):
    """The compiled serial ``rowdot(wr, xq, xd, xs, sc) -> float32`` of ``wtype`` (not for 'plain')."""
    variant = variant or default_variant()
    t = T(wtype)
    row, info = cpu_traits(t).row, type_info(t)
    if row is None:
        return build(rowdot_deq, f"{t.name}_deq", False, DEQ=deq_kernel(t), TS=info.type_size, BS=info.block_size)
    if row.kind == "float":
        return build(rowdot_float, t.name, False, LD=row.fn, ES=info.type_size)
    return build(rowdot_ir, f"{t.name}_{variant}", False, ROW=row_intrinsic(t, variant))


def rowdots_kernel(wtype, variant: str | None = None):
    """(``rowdots``, n): the compiled serial ``rowdots(wr, xq, xd, xs, sc) -> n x float32`` of ``wtype``,
    the dots of n consecutive rows (``wr`` = their n * row_bytes bytes) sharing the activation loads: 2
    for a quantized row dot (each sum equal to ``rowdot``'s), ``FLOAT_ROWS`` for float weights (each sum
    ``rowdot``'s up to float32 summation order), 2 through ``rowdot`` itself for the portable path."""
    variant = variant or default_variant()
    t = T(wtype)
    row, info = cpu_traits(t).row, type_info(t)
    if row is not None and row.kind == "float":
        return build(rowdot8_float, t.name, False, LD=row.fn, ES=info.type_size), FLOAT_ROWS
    if row is None or row.kind != "ir":
        return build(rowdot2_split, t.name, False, ROWDOT=rowdot_kernel(t, variant)), 2
    return build(rowdot2_ir, f"{t.name}_{variant}", False, ROW2=row_intrinsic(t, variant, 2)), 2


# -- the 8-row interleaved layout (a type's x8 entry, ir_x8.X8) -----------------------------------

def x8_types(variant: str | None = None) -> tuple:
    """The weight types with an x8 kernel for a variant on this CPU (none for generic and plain)."""
    if not x8_flavour(variant or default_variant()):
        return ()
    return tuple(T[n] for n, c in CPU_TRAITS.items() if c.x8 is not None)


def pack_x8(w: np.ndarray, wtype, out: np.ndarray | None = None) -> np.ndarray:
    """w uint8 (n_rows, row_bytes) of an x8 type, n_rows a multiple of 8 -> its x8 layout (ir_x8.py):
    uint8 (n_rows / 8, 8 * row_bytes); per group and block index, the header fields with the 8 rows'
    values of each element side by side and the quants in 64-byte slices of 8 bytes per row, where
    ``x8_places`` says (Q6_K: header first, slices in its kernel's reading order). Into ``out`` (any
    uint8 array of that size) if given."""
    spec = cpu_traits(wtype).x8
    ts, fields, (q0, q1) = spec.ts, spec.fields, spec.quant
    f_at, q_at, order = x8_places(spec)
    n, rb = w.shape
    if n % X8_ROWS or rb % ts:
        raise ValueError(f"pack_x8: {n} rows of {rb} bytes do not make {X8_ROWS}-row groups of {ts}-byte blocks")
    ng, nb, qb = n // X8_ROWS, rb // ts, q1 - q0
    if out is None:
        out = np.empty(n * rb, np.uint8)
    o = out.reshape(ng, nb, X8_ROWS * ts)
    g = np.asarray(w).reshape(ng, X8_ROWS, nb, ts)
    R = X8_ROWS
    for i in range(ng):  # one group at a time: no whole-matrix temporaries
        gi = g[i]
        for (off, size, el), at in zip(fields, f_at):  # (rows, nb, elements, el) -> (nb, elements, rows, el)
            f = gi[:, :, off:off + size].reshape(R, nb, size // el, el).transpose(1, 2, 0, 3)
            o[i, :, at:at + R * size] = f.reshape(nb, R * size)
        q = gi[:, :, q0:q1].reshape(R, nb, qb // 8, 8).transpose(1, 2, 0, 3)  # (nb, slices, rows, 8)
        if order is not None:
            q = q[:, order]
        o[i, :, q_at:q_at + R * qb] = q.reshape(nb, R * qb)
    return out.reshape(ng, R * rb)


def rowx8_kernel(wtype, variant: str | None = None):
    """The ``ROWX8(wg, xq, xd, xs) -> 8 x float32`` intrinsic of an x8 type (ir_x8.row_dot_x8) for a
    variant's x8 flavour."""
    flavour = x8_flavour(variant or default_variant())
    if flavour is None:
        raise ValueError(f"no x8 kernels for variant {variant or default_variant()!r}")
    key = (T(wtype), "x8", flavour)
    if key not in _DOTS:
        _DOTS[key] = row_dot_x8(cpu_traits(wtype).x8, flavour)
    return _DOTS[key]


def deq_kernel(wtype):
    """The compiled serial row decoder ``deq(src_row_u8, dst_row_f32)`` of ``wtype``: its codec's
    ``dequantize_row`` (QuantError, one line, for a type quantkit has no codec for)."""
    return traits(wtype).dequantize_row


def deq_rows_kernel(wtype):
    t = T(wtype)
    return build(deq_rows_body, t.name, True, DEQ=deq_kernel(t))


def get_rows_kernel(wtype):
    t = T(wtype)
    return build(get_rows_body, t.name, True, DEQ=deq_kernel(t))
