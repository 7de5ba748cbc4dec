"""Row dots (one weight row . one token's quantized activations) and the GEMV kernels built on them.

Each ``rowdot_X(wr, xq, xd, xs, sc) -> float32`` takes one weight row's bytes ``wr`` (1-D uint8), one
token's planar activations (``xq`` int8 quants, ``xd`` float32 block scales, ``xs`` int32 group
sums; see activations.py) and a 16-int32 scratch ``sc`` for decoded sub-block scales. The integer
part of every (super-)block is one IR intrinsic (``DOT_X``, ir.py) returning an int32; the fp16
scales, the mins / offsets (through the activation sums) and the float accumulate are numba code,
one float multiply-add per block as ggml's ``vec_dot_X_Y``.

The bodies are written once and *built* per variant: ``build(fn, variant, ...)`` copies a body with
the variant's intrinsics in its globals and compiles it -- the umap habit of one body, several
builds (serial / parallel, vnni / generic / plain), so they can be compared in tests.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit.formats.ggml_types import type_info
from quantkit.jit import prange, specialize
from quantkit.kernels.cpu_traits import CPU_TRAITS, cpu_traits
from quantkit.kernels.ir import PREFETCH, default_variant, prefetch
from quantkit.kernels.ir_rowdot import row_dot
from quantkit.kernels.ir_x8 import X8_ROWS, row_dot_x8, x8_flavour, x8_places
from quantkit.quants import traits

F = np.float32


def rowdot_ir(wr, xq, xd, xs, sc):
    """A quantized row: one IR intrinsic (``row_intrinsic``) does the whole row."""
    return ROW(wr, xq, xd, xs)  # noqa: F821


def rowdot2_ir(wr, xq, xd, xs, sc):
    """Two consecutive quantized rows (``wr`` holds both): one IR loop sharing the activation loads,
    each row's sum bit-identical to ``rowdot_ir``'s. -> (float32, float32)"""
    return ROW2(wr, xq, xd, xs)  # noqa: F821


def rowdot2_split(wr, xq, xd, xs, sc):
    """Two consecutive rows with the 1-row dot (unquantized weights; a shared-load two-row loop
    measured slower here for SmolLM2's cache-resident 576-wide rows)."""
    n = wr.shape[0] // 2
    return ROWDOT(wr[:n], xq, xd, xs, sc), ROWDOT(wr[n:], xq, xd, xs, sc)  # noqa: F821


# -- unquantized weights: float32 activations (xq is the float32 row; xd, xs unused) ---------------
# Each first prefetches the next row's cache lines (rows lie one after another; past the matrix's end
# the prefetch is harmless): streaming F16 rows from DRAM measured 10-25 % faster so (SmolLM2 shapes,
# 1 and 2 threads; prefetching 2+ rows ahead was slower). ``PREFETCH`` = 0 turns it off as for the
# quantized dots.

def prefetch_next_row(wr):
    """Prefetch the cache lines of the row after ``wr`` (the next ``wr.shape[0]`` bytes). Bound into
    the bodies below as ``NEXT_ROW`` by ``build``, whose cache tag carries ``PREFETCH``."""
    if PREFETCH:
        for o in range(wr.shape[0], 2 * wr.shape[0], 64):
            prefetch(wr, o)


def rowdot_float(wr, xq, xd, xs, sc):
    """F32 / F16 / BF16 weights (``LD``: the type's ``Row`` load, ``ld_f32`` / ``ld_f16`` / ``ld_bf16``;
    ``ES`` bytes a weight, its type size);
    ``xq`` is the float32 row, already rounded to fp16 / bf16 for those (kinds 'F16' / 'BF16': ggml's
    vec_dot_type of each)."""
    NEXT_ROW(wr)  # noqa: F821
    acc = F(0.0)
    for j in range(xq.shape[0]):
        acc += LD(wr, ES * j) * xq[j]  # noqa: F821
    return acc


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


# -- GEMV bodies -----------------------------------------------------------------------------------

def matvec_body(w, xq, xd, xs, out, chunk):
    """out[t, r] = w[r] . x[t] for every token t; prange over chunks of ``chunk`` rows, each thread
    owning its rows (no cross-thread reduction: results do not depend on the thread count). The
    token loop is innermost so a weight row is read from memory once for all tokens."""
    n_out = w.shape[0]
    n_tok = xq.shape[0]
    rb = w.shape[1]
    wf = w.reshape(n_out * rb)
    n_chunks = (n_out + chunk - 1) // chunk
    for c in prange(n_chunks):
        sc = np.zeros(16, np.int32)
        r0 = c * chunk
        r1 = min(r0 + chunk, n_out)
        r = r0
        while r + 1 < r1:  # rows in pairs (ROWDOT2: shared activation loads, same sums as ROWDOT)
            w2 = wf[r * rb:(r + 2) * rb]
            for t in range(n_tok):
                s0, s1 = ROWDOT2(w2, xq[t], xd[t], xs[t], sc)  # noqa: F821
                out[t, r] = s0
                out[t, r + 1] = s1
            r += 2
        if r < r1:
            wr = w[r]
            for t in range(n_tok):
                out[t, r] = ROWDOT(wr, xq[t], xd[t], xs[t], sc)  # noqa: F821


def matvec_x8_body(wp, xq, xd, xs, out, chunk):
    """``matvec_body`` for weights in the 8-row interleaved layout (``pack_x8``): wp uint8
    (n_out / 8, 8 * row_bytes); prange over chunks of ``chunk`` rows (a multiple of 8)."""
    n_g = wp.shape[0]
    n_tok = xq.shape[0]
    gpc = max(chunk // 8, 1)
    n_chunks = (n_g + gpc - 1) // gpc
    for c in prange(n_chunks):
        for g in range(c * gpc, min((c + 1) * gpc, n_g)):
            for t in range(n_tok):
                r = ROWX8(wp[g], xq[t], xd[t], xs[t])  # noqa: F821
                for i in range(8):
                    out[t, 8 * g + i] = r[i]


def matvec_plain_body(w, xq, xd, xs, out, chunk):
    """The portable fallback: dequantize each weight row (DEQ) and dot it with float32 activations."""
    n_out = w.shape[0]
    n_tok = xq.shape[0]
    n_in = xq.shape[1]
    n_chunks = (n_out + chunk - 1) // chunk
    for c in prange(n_chunks):
        row = np.empty(n_in, np.float32)
        r0 = c * chunk
        r1 = min(r0 + chunk, n_out)
        for r in range(r0, r1):
            DEQ(w[r], row)  # noqa: F821
            for t in range(n_tok):
                x = xq[t]
                acc = F(0.0)
                for j in range(n_in):
                    acc += row[j] * x[j]
                out[t, r] = acc


def gemv_q_body(w, x, out, chunk):
    """Quantize x to the planar activations of kind (QUANT, QD, QS) and run MATVEC: one compiled
    call per matmul, so the Python-level cost of a small GEMV is a single dispatch."""
    n_tok = x.shape[0]
    n_in = x.shape[1]
    xq = np.empty((n_tok, n_in), np.int8)
    xd = np.empty((n_tok, n_in // QD), np.float32)  # noqa: F821
    xs = np.empty((n_tok, n_in // QS), XS_DTYPE)  # noqa: F821
    QUANT(x, xq, xd, xs)  # noqa: F821
    MATVEC(w, xq, xd, xs, out, chunk)  # noqa: F821


def gemv_f_body(w, x, out, chunk):
    """MATVEC with float32 activations (F32 weights, and the plain variant)."""
    n_tok = x.shape[0]
    MATVEC(w, x, np.empty((n_tok, 0), np.float32), np.empty((n_tok, 0), np.int32), out, chunk)  # noqa: F821


def gemv_r_body(w, x, out, chunk):
    """MATVEC with float activations rounded once by ROUND (F16 / BF16 weights)."""
    n_tok = x.shape[0]
    xr = np.empty_like(x)
    ROUND(x, xr)  # noqa: F821
    MATVEC(w, xr, np.empty((n_tok, 0), np.float32), np.empty((n_tok, 0), np.int32), out, chunk)  # noqa: F821


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
        return build(rowdot_float, t.name, False, NEXT_ROW=build(prefetch_next_row, "f", False), LD=row.fn,
                     ES=info.type_size)
    return build(rowdot_ir, f"{t.name}_{variant}", False, ROW=row_intrinsic(t, variant))


def rowdot2_kernel(wtype, variant: str | None = None):
    """The compiled serial ``rowdot2(wr2, xq, xd, xs, sc) -> (float32, float32)`` of ``wtype``: the
    dots of two consecutive rows (``wr2`` = their 2 * row_bytes bytes), each equal to ``rowdot``'s."""
    variant = variant or default_variant()
    t = T(wtype)
    if cpu_traits(t).row is None or cpu_traits(t).row.kind != "ir":
        return build(rowdot2_split, t.name, False, ROWDOT=rowdot_kernel(t, variant))
    return build(rowdot2_ir, f"{t.name}_{variant}", False, ROW2=row_intrinsic(t, variant, 2))


def matvec_kernel(wtype, variant: str | None = None, parallel: bool = True):
    """The compiled ``matvec(w, xq, xd, xs, out, chunk)`` of ``wtype``: w uint8 (n_out, row_bytes),
    activations as ``activation_kind(wtype, variant)``, out float32 (n_tok, n_out)."""
    variant = variant or default_variant()
    t = T(wtype)
    if variant == "plain":
        return build(matvec_plain_body, f"{t.name}_plain", parallel, DEQ=deq_kernel(t))
    return build(matvec_body, f"{t.name}_{variant}", parallel, ROWDOT=rowdot_kernel(t, variant),
                 ROWDOT2=rowdot2_kernel(t, variant))


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


def matvec_x8_kernel(wtype, parallel: bool = True, variant: str | None = None):
    """The compiled ``matvec(wp, xq, xd, xs, out, chunk)`` for ``pack_x8`` weights of ``wtype``
    (activations as ``activation_kind(wtype)``)."""
    t = T(wtype)
    flavour = x8_flavour(variant or default_variant())
    return build(matvec_x8_body, f"{t.name}_x8{flavour}", parallel, ROWX8=rowx8_kernel(t, variant))


def gemv_kernel(wtype, variant: str | None = None):
    """The compiled ``gemv(w, x, out, chunk)``: quantize float32 x (n_tok, n_in) and multiply."""
    from quantkit.kernels.activations import ACT_LAYOUT, ACT_QUANTIZER, ACT_SUM_DTYPE, FLOAT_KINDS

    from numba.np.ufunc.parallel import _launch_threads

    variant = variant or default_variant()
    t = T(wtype)
    kind = activation_kind(t, variant)
    mv = matvec_kernel(t, variant)
    # The serial wrapper calls a parallel kernel; loaded from numba's cache, it does not start numba's
    # threading layer itself, and a process whose first parallel call went through it crashed (SIGSEGV)
    _launch_threads()
    if kind == "F32":
        return build(gemv_f_body, f"{t.name}_{variant}", False, MATVEC=mv)
    if kind in FLOAT_KINDS:
        return build(gemv_r_body, f"{t.name}_{variant}", False, MATVEC=mv, ROUND=FLOAT_KINDS[kind])
    qd, qs = ACT_LAYOUT[kind]
    return build(gemv_q_body, f"{t.name}_{variant}", False, MATVEC=mv, QUANT=ACT_QUANTIZER[kind], QD=qd,
                 QS=qs, XS_DTYPE=ACT_SUM_DTYPE[kind])


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
