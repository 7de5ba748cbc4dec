"""Row runners -- one type's rows . one input vector, as a C-callable build -- and the GEMV over them.

A *row runner* computes ``out[o0 + r] = row r . x`` for a range of rows of one matrix, for one weight
type and layout: the file's rows (``run_rows``: the type's row dots, two rows at a time), the 8-row
interleaved copy (``run_rows_x8``), the portable ``plain`` path (``run_plain``: each row decoded, then a
float32 dot), or the embedding lookup (``run_deq``). Each is built as a ``numba.cfunc`` of one signature
of integers (``RUN_SIG``: addresses and sizes, from which it views its arrays with ``jit.view_*``), so
compiled code calls it through a function pointer (``jit.call_addr``, the runner's address passed as an
int64): through one a call with array arguments costs ~40 ns, with integers ~3 ns.

The callers are built once for every type instead of once per type:

* the decode step (quantkit/model/decode.py) holds a table of its model's runners, one per slot;
* ``matvec_kernel(t)`` / ``matvec_x8_kernel(t)`` bind a type's runner to one generic GEMV body
  (``matvec_body``: a ``prange`` over chunks of rows, the runner called per chunk and token), and
  ``gemv_kernel(t)`` to a generic quantize-and-multiply body per activation kind. Each numba
  ``prange`` build costs ~1 CPU-s of compiling whatever it calls, so one per type and variant was
  most of the test suite's compiling (100 GEMV builds of ~1.2 CPU-s, docs/DEVELOPING.md).

The activation table: every activation form a row dot may take, by index -- 0 float32 row, 1 Q8 int8
quants, 2 Q8 float scales, 3 Q8_0 int32 sums, 4 Q8_1 float sums, 5 Q8_K quants, 6 Q8_K scales, 7 Q8_K
bsums, 8 the row rounded to fp16, 9 to bf16 -- as (address, length) pairs (``act_table``). A runner
views the three of its activation kind (``ACT_FIELDS``: its type's vec_dot type); a caller with one
kind's (quants, scales, sums) puts them in every place of their role (``ACT_ROLE``).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from quantkit.formats.ggml_types import type_info
from quantkit.jit import VIEWS, addr_of, call_addr, prange, specialize, view_f32, view_i32, view_i64, view_u8_ro
from quantkit.kernels.cpu_traits import kind_of
from quantkit.kernels.ir import default_variant
from quantkit.kernels.ir_x8 import X8_ROWS
from quantkit.kernels.vecdot import activation_kind, build, deq_kernel, rowdot_kernel, rowdots_kernel, rowx8_kernel

F = np.float32

#: activation kind -> the indices in the activation table of the (quants, scales, sums) its row dots take
ACT_FIELDS = {"Q8_0": (1, 2, 3), "Q8_1": (1, 2, 4), "Q8_K": (5, 6, 7), "F32": (0, 2, 3), "F16": (8, 2, 3),
              "BF16": (9, 2, 3)}
#: the element type of each activation form
ACT_DTYPES = (np.float32, np.int8, np.float32, np.int32, np.float32, np.int8, np.float32, np.int32, np.float32,
              np.float32)
#: the role of each form: 0 the quants (or the float row), 1 the block scales, 2 the block sums
ACT_ROLE = (0, 0, 1, 2, 2, 0, 1, 2, 0, 0)
N_FORMS = len(ACT_DTYPES)
assert all(ACT_ROLE[i] == r for f in ACT_FIELDS.values() for r, i in enumerate(f))
#: a row runner's signature: (weights' address, x8 copy's address, matrix offset, bytes a row (an x8
#: group), first row, end row, activation table's address, output's address, output offset, scratch's address)
RUN_SIG = types.void(*([types.int64] * 10))
#: int32 items of the row dots' scratch ``sc`` (``run_plain`` takes one float32 row there instead)
SC_LEN = 16


# -- the runners ------------------------------------------------------------------------------------

def run_rows(bp, pp, off, rb, r0, r1, ap, op, o0, sp):
    """out[o0 + r] = (row r of the matrix at bp + off) . a for r in r0..r1-1: rows ``NR`` at a time
    (ROWDOTS shares the activation loads between them), then the last ones by ROWDOT. ``COPY``: the rows
    are read at pp + off, the decode step's copy of the file's rows (float weights), else ``pp`` is not
    read (one signature for every layout). ``ap``: the activation table, from which the forms of this
    type's activation kind are viewed."""
    at = view_i64(ap, 2 * N_FORMS)
    xq, xd, xs = VQ(at[2 * AQ], at[2 * AQ + 1]), VD(at[2 * AD], at[2 * AD + 1]), VS(at[2 * AS], at[2 * AS + 1])  # noqa: F821
    buf = view_u8_ro((pp if COPY else bp) + off, r1 * rb)  # noqa: F821
    out = view_f32(op, o0 + r1)
    sc = view_i32(sp, SC_LEN)
    r = r0
    while r + NR <= r1:  # noqa: F821
        s = ROWDOTS(buf[r * rb:(r + NR) * rb], xq, xd, xs, sc)  # noqa: F821
        for i in range(NR):  # noqa: F821
            out[o0 + r + i] = s[i]
        r += NR  # noqa: F821
    while r < r1:
        out[o0 + r] = ROWDOT(buf[r * rb:(r + 1) * rb], xq, xd, xs, sc)  # noqa: F821
        r += 1


def run_rows_x8(bp, pp, off, rb, r0, r1, ap, op, o0, sp):
    """``run_rows`` for a matrix in the x8 layout at pp + off (``rb`` = bytes of one 8-row group); r0
    is a multiple of 8 and so is the matrix's row count. ``ROWX8`` is the IR intrinsic itself: its code
    is emitted here."""
    at = view_i64(ap, 2 * N_FORMS)
    xq, xd, xs = VQ(at[2 * AQ], at[2 * AQ + 1]), VD(at[2 * AD], at[2 * AD + 1]), VS(at[2 * AS], at[2 * AS + 1])  # noqa: F821
    g = r0 // X8_ROWS
    g1 = (r1 + X8_ROWS - 1) // X8_ROWS
    pbuf = view_u8_ro(pp + off, g1 * rb)
    out = view_f32(op, o0 + g1 * X8_ROWS)
    while g < g1:
        r = ROWX8(pbuf[g * rb:(g + 1) * rb], xq, xd, xs)  # noqa: F821
        for i in range(X8_ROWS):
            out[o0 + g * X8_ROWS + i] = r[i]
        g += 1


def run_plain(bp, pp, off, rb, r0, r1, ap, op, o0, sp):
    """The portable fallback (``QUANTKIT_KERNELS=plain``): each row decoded (``DEQ``, the type's row
    decoder) into the scratch, then dotted in float32 with the float32 activations (form 0)."""
    at = view_i64(ap, 2 * N_FORMS)
    x = view_f32(at[0], at[1])
    row = view_f32(sp, at[1])
    buf = view_u8_ro(bp + off, r1 * rb)
    out = view_f32(op, o0 + r1)
    for r in range(r0, r1):
        DEQ(buf[r * rb:(r + 1) * rb], row)  # noqa: F821
        acc = F(0.0)
        for j in range(x.shape[0]):
            acc += row[j] * x[j]
        out[o0 + r] = acc


def run_deq(bp, pp, off, rb, r0, r1, ap, op, o0, sp):
    """The embedding lookup in ``run_rows``' signature (so one table serves both): out = dequantized
    row r0 of the matrix at bp + off (``DEQ``, the type's row decoder; ``PER_BYTE``: its values a byte
    of row, as (block size, type size))."""
    DEQ(view_u8_ro(bp + off + r0 * rb, rb), view_f32(op, rb // PER_BYTE[1] * PER_BYTE[0]))  # noqa: F821


def _views(kind: str) -> dict:
    aq, ad, as_ = ACT_FIELDS[kind]
    return dict(AQ=aq, AD=ad, AS=as_, VQ=VIEWS[np.dtype(ACT_DTYPES[aq])], VD=VIEWS[np.dtype(ACT_DTYPES[ad])],
                VS=VIEWS[np.dtype(ACT_DTYPES[as_])])


def rows_runner(tag: str, kind: str, rowdot, rowdots, nrows: int, copy: bool = False):
    """A ``run_rows`` runner over given compiled row dots (``rowdot``; ``rowdots``, ``nrows`` rows at a
    time) taking activations of ``kind``, reading the file's rows or (``copy``) the step's copy of them;
    ``tag`` names its cache entry."""
    return specialize(run_rows, tag + ("_copy" if copy else ""), fast=True, cfunc=RUN_SIG, ROWDOT=rowdot,
                      ROWDOTS=rowdots, NR=nrows, COPY=copy, **_views(kind))


def copies_rows(t) -> bool:
    """Whether the decode step reads type ``t``'s matrices from a copy of the file's rows in its own
    huge-page memory (its second layout, as the x8 types' interleaved copy): float weights, which stream
    ~11 % faster so on the Sapphire Rapids machine (1B F16 tg32 10.5-10.6 -> 11.8 t/s from the map and
    from the copy; docs/performance-history.md, "Float decode from a copy")."""
    return kind_of(t, "row") == "float"


def row_runner(t, x8: bool, variant: str | None = None):
    """The C-callable row runner of GGML type ``t`` in its second layout (``x8``: the x8 layout, or for a
    type that ``copies_rows`` the step's copy of its rows) or the file's rows (``RUN_SIG``), for a variant
    (``plain``: ``run_plain``)."""
    variant = variant or default_variant()
    t = T(t)
    if variant == "plain":
        return specialize(run_plain, t.name, fast=True, cfunc=RUN_SIG, DEQ=deq_kernel(t))
    kind = activation_kind(t, variant)
    if x8 and copies_rows(t):
        return rows_runner(f"{t.name}_{variant}", kind, rowdot_kernel(t, variant), *rowdots_kernel(t, variant),
                           copy=True)
    if x8:
        return specialize(run_rows_x8, f"{t.name}_x8_{variant}", fast=True, cfunc=RUN_SIG,
                          ROWX8=rowx8_kernel(t, variant), **_views(kind))
    return rows_runner(f"{t.name}_{variant}", kind, rowdot_kernel(t, variant), *rowdots_kernel(t, variant))


def deq_runner(t):
    """The C-callable embedding-row lookup of GGML type ``t`` (``RUN_SIG``)."""
    info = type_info(t)
    return specialize(run_deq, T(t).name, fast=True, cfunc=RUN_SIG, DEQ=deq_kernel(t),
                      PER_BYTE=(info.block_size, info.type_size))


def act_table(a: tuple) -> np.ndarray:
    """int64 (20,): the address and length of each activation form of ``a`` (N_FORMS arrays (1, n), in
    the table's order), which a row runner views its forms from (the caller keeps them alive)."""
    return np.array([v for x in a for v in (x.ctypes.data, x.shape[1])], np.int64)


# -- the GEMV over a runner -------------------------------------------------------------------------

def matvec_body(run, w, per, xq, xd, xs, out, chunk):
    """out[t, r] = row r . x[t] for every token t by the runner at address ``run``: w uint8 (n_out / per, per *
    row_bytes) -- the file's rows (per 1) or the x8 layout (per 8) --, activations (xq, xd, xs) of the
    runner's kind (each (n_tok, ...): its quants or float row, scales, sums). prange over chunks of
    ``chunk`` rows (rounded to a multiple of ``per``), each thread owning its rows and calling the
    runner once per token, the chunk's rows staying in its cache between tokens: the results do not
    depend on the thread count."""
    n_out = w.shape[0] * per
    rb = w.shape[1]
    n_tok = xq.shape[0]
    wa = addr_of(w)
    ck = max(chunk // per, 1) * per
    n_chunks = (n_out + ck - 1) // ck
    for c in prange(n_chunks):
        at = np.empty(2 * N_FORMS, np.int64)
        sc = np.zeros(max(SC_LEN, xq.shape[1]), np.int32)  # run_plain's float32 row, or the dots' scratch
        r0 = np.int64(c) * ck
        r1 = min(r0 + ck, n_out)
        for t in range(n_tok):
            q, d, s = addr_of(xq[t]), addr_of(xd[t]), addr_of(xs[t])
            for i in range(N_FORMS):
                role = ACT_ROLE[i]
                at[2 * i] = q if role == 0 else d if role == 1 else s
                at[2 * i + 1] = xq.shape[1] if role == 0 else xd.shape[1] if role == 1 else xs.shape[1]
            call_addr(run, wa, wa, 0, rb, r0, r1, addr_of(at), addr_of(out[t]), 0, addr_of(sc))


def gemv_q_body(run, w, x, out, chunk):
    """Quantize x to the planar activations of kind (QUANT, QD, QS) and run MATVEC with ``run``: one
    compiled call per matmul, so the Python-level cost of a small GEMV is a single dispatch."""
    n_tok = x.shape[0]
    n_in = x.shape[1]
    xq = np.empty((n_tok, n_in), np.int8)
    xd = np.empty((n_tok, n_in // QD), np.float32)  # noqa: F821
    xs = np.empty((n_tok, n_in // QS), XS_DTYPE)  # noqa: F821
    QUANT(x, xq, xd, xs)  # noqa: F821
    MATVEC(run, w, 1, xq, xd, xs, out, chunk)  # noqa: F821


def gemv_f_body(run, w, x, out, chunk):
    """MATVEC with float32 activations (F32 weights, the portable path and the plain variant)."""
    n_tok = x.shape[0]
    MATVEC(run, w, 1, x, np.empty((n_tok, 0), np.float32), np.empty((n_tok, 0), np.int32), out, chunk)  # noqa: F821


def gemv_r_body(run, w, x, out, chunk):
    """MATVEC with float activations rounded once by ROUND (F16 / BF16 weights)."""
    n_tok = x.shape[0]
    xr = np.empty_like(x)
    ROUND(x, xr)  # noqa: F821
    MATVEC(run, w, 1, xr, np.empty((n_tok, 0), np.float32), np.empty((n_tok, 0), np.int32), out, chunk)  # noqa: F821


class Bound:
    """A generic compiled kernel with a type's runner bound: ``k(*args)`` calls ``fn(addr, *args)`` (the
    runner's address; ``runner`` keeps its code alive), with ``per`` (rows an entry of the weights
    holds) after the weights for a matvec."""

    __slots__ = ("fn", "runner", "run", "per")

    def __init__(self, fn, runner, per=None):
        self.fn, self.runner, self.run, self.per = fn, runner, runner.address, per

    def __call__(self, w, *args):
        if self.per is None:
            return self.fn(self.run, w, *args)
        return self.fn(self.run, w, self.per, *args)


def _matvec(parallel: bool):
    return build(matvec_body, "any", parallel)


def matvec_kernel(wtype, variant: str | None = None, parallel: bool = True) -> Bound:
    """``matvec(w, xq, xd, xs, out, chunk)`` of ``wtype``: w uint8 (n_out, row_bytes), activations as
    ``activation_kind(wtype, variant)``, out float32 (n_tok, n_out)."""
    return Bound(_matvec(parallel), row_runner(wtype, False, variant), 1)


def matvec_x8_kernel(wtype, parallel: bool = True, variant: str | None = None) -> Bound:
    """``matvec(wp, xq, xd, xs, out, chunk)`` for ``pack_x8`` weights of ``wtype`` (activations as
    ``activation_kind(wtype)``)."""
    return Bound(_matvec(parallel), row_runner(wtype, True, variant), X8_ROWS)


def gemv_kernel(wtype, variant: str | None = None) -> Bound:
    """``gemv(w, x, out, chunk)``: quantize float32 x (n_tok, n_in) to ``wtype``'s activation kind and
    multiply; one compiled body per kind, the type's runner bound."""
    from numba.np.ufunc.parallel import _launch_threads

    from quantkit.kernels.activations import ACT_LAYOUT, ACT_QUANTIZER, ACT_SUM_DTYPE, FLOAT_KINDS

    variant = variant or default_variant()
    kind = activation_kind(wtype, variant)
    run = row_runner(wtype, False, variant)
    mv = _matvec(True)
    # The serial body calls a parallel kernel; loaded from numba's cache, it does not start numba's
    # threading layer itself, and a process whose first parallel call went through it crashed (SIGSEGV)
    _launch_threads()
    if kind == "F32":
        return Bound(build(gemv_f_body, "any", False, MATVEC=mv), run)
    if kind in FLOAT_KINDS:
        return Bound(build(gemv_r_body, kind, False, MATVEC=mv, ROUND=FLOAT_KINDS[kind]), run)
    qd, qs = ACT_LAYOUT[kind]
    return Bound(build(gemv_q_body, kind, False, MATVEC=mv, QUANT=ACT_QUANTIZER[kind], QD=qd, QS=qs,
                       XS_DTYPE=ACT_SUM_DTYPE[kind]), run)
