"""Prefill GEMM for BF16 weights on AVX512-BF16's ``vdpbf16ps`` (Zen 4 / 5, Sapphire Rapids, Cooper Lake).

ggml multiplies BF16 weights with activations rounded to bf16 (BF16's ``vec_dot_type``), and on CPUs
with AVX512-BF16 its llamafile sgemm (``ggml-cpu/llamafile/sgemm.cpp``, ``tinyBLAS`` with
``_mm512_dpbf16_ps``) runs the batch on that instruction: each 32-bit lane of a ``zmm`` holds two bf16,
and one ``vdpbf16ps`` adds both lanes' products to 16 float32 accumulators -- twice what an fp32 FMA
does per instruction. The dequantize + BLAS prefill (``mul_mat._prefill``) widens the weights to float32
first and measured 0.56x llama.cpp on a Zen 4 (docs/performance.md). This module is the integer GEMM's
shape (kernels/gemm.py) in float:

* **Pack once per tile.** A thread's tile of weight rows is copied 16 rows at a time into
  ``[K/2][16]`` u32 words: word (k, r) is row r's elements 2k and 2k + 1, so one 64-byte load is the
  same element pair of 16 rows (the bytes move; nothing is converted).
* **Micro-kernel** (2 sub-tiles of 16 rows x ``COLS`` tokens): per element pair, 2 weight loads, one
  broadcast of each token's pair, ``2 * COLS`` ``vdpbf16ps``; lane r accumulates row r, no
  horizontal sums. The activations are the bf16 rounding of x (``round_bf16_into``, as the BLAS path
  and ggml round them), their upper 16 bits.

Each output is one float32 accumulator running over K in order, so results do not depend on the
thread count or on the tokens beside it. ``vdpbf16ps`` flushes denormal inputs and outputs to zero
and rounds each of its two additions; against a float64 product of the same bf16 values the error
is float32 accumulation's (tests/test_gemm_bf16.py). The instruction is emitted as inline assembly:
LLVM 22 types its intrinsic with ``bfloat`` vectors, which llvmlite's IR builder lacks.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.jit import njit_parallel, prange
from quantkit.kernels.activations import round_half_rows
from quantkit.kernels.gemm import LANES, TILE_BYTES, store_tile
from quantkit.kernels.ir import F32T, I32, I64, _byte_ptr

# numba sets up LLVM's native target and asm printer, not its asm parser, which inline assembly needs
llvm.initialize_native_asmparser()

#: tokens per micro-kernel call (rows per sub-tile: gemm.LANES, one zmm of float32 lanes; bytes of
#: packed weights per tile: gemm.TILE_BYTES)
COLS = 8
V16I32 = ir.VectorType(I32, 16)
V16F32 = ir.VectorType(F32T, 16)


def _dpbf16(b, acc, w, x):
    """acc (<16 x float>) + per lane the two bf16 products of w's and x's 32-bit lanes (vdpbf16ps)."""
    fty = ir.FunctionType(V16F32, [V16F32, V16I32, V16I32])
    return b.asm(fty, "vdpbf16ps $3, $2, $0", "=v,0,v,v", [acc, w, x], False, name="dpbf16")


def _micro(ns: int):
    """``mk(wp, xp, out, t0, ct, r0, nr)``: out[t0 + c, r0 + l] for c < ct (<= COLS), l < nr (the ``ns``
    16-row sub-tiles of packed words ``wp``, the last may be partial) from the tokens' bf16 pairs
    ``xp`` (u32 (n_pad, K/2))."""

    def impl(typingctx, wp, xp, out, t0, ct, r0, nr):
        sig = types.void(wp, xp, out, t0, ct, r0, nr)

        def codegen(context, builder, signature, args):
            b = builder
            ta = signature.args
            zero = context.get_constant(types.intp, 0)
            wbase, xbase, obase = (_byte_ptr(context, b, ta[i], args[i], zero, types.intp) for i in range(3))
            t0_, ct_, r0_, nr_ = (context.cast(b, args[i], ta[i], types.intp) for i in range(3, 7))
            kp = cgutils.unpack_tuple(b, context.make_array(ta[1])(context, b, args[1]).shape)[1]
            n_out = cgutils.unpack_tuple(b, context.make_array(ta[2])(context, b, args[2]).shape)[1]
            c = lambda v: ir.Constant(I64, v)  # noqa: E731
            subs = [b.gep(wbase, [b.mul(b.mul(kp, c(64)), c(j))]) for j in range(ns)]
            xrows = [b.gep(xbase, [b.mul(b.mul(b.add(t0_, c(t)), kp), c(4))]) for t in range(COLS)]
            accs = [[cgutils.alloca_once_value(b, ir.Constant(V16F32, None)) for _ in range(COLS)] for _ in range(ns)]
            with cgutils.for_range(b, kp) as loop:
                k = loop.index
                ws = [b.load(b.bitcast(b.gep(s, [b.mul(k, c(64))]), V16I32.as_pointer()), align=1) for s in subs]
                for t in range(COLS):
                    x = b.load(b.bitcast(b.gep(xrows[t], [b.mul(k, c(4))]), I32.as_pointer()), align=1)
                    xv = b.insert_element(ir.Constant(V16I32, None), x, ir.Constant(I32, 0))
                    xv = b.shuffle_vector(xv, xv, ir.Constant(V16I32, [0] * 16))
                    for j, w in enumerate(ws):
                        b.store(_dpbf16(b, b.load(accs[j][t]), w, xv), accs[j][t])
            toks = [b.add(t0_, c(t)) for t in range(COLS)]
            store_tile(b, obase, accs, toks, ct_, r0_, nr_, n_out)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"gemm_bf16_micro_{ns}"
    return intrinsic(impl)


_MK1, _MK2 = _micro(1), _micro(2)


@njit_parallel
def _gemm_bf16(w, xp, out, mr):
    """out (n_tok, n_out) = bf16 weights w (u32 (n_out, K/2)) x activation pairs xp (u32 (n_pad, K/2),
    rows padded to a multiple of COLS); prange over tiles of ``mr`` rows (a multiple of 32)."""
    n_out, kp = w.shape
    n_tok = out.shape[0]
    for tile in prange((n_out + mr - 1) // mr):
        r0 = tile * mr
        r1 = min(r0 + mr, n_out)
        nsub = (r1 - r0 + LANES - 1) // LANES
        pk = np.zeros(nsub * kp * LANES, np.uint32)
        for s in range(nsub):
            base = s * kp * LANES
            for r in range(min(LANES, r1 - r0 - s * LANES)):
                row = w[r0 + s * LANES + r]
                for k in range(kp):
                    pk[base + k * LANES + r] = row[k]
        for t0 in range(0, n_tok, COLS):
            ct = min(COLS, n_tok - t0)
            s = 0
            while s + 1 < nsub:
                _MK2(pk[s * kp * LANES:(s + 2) * kp * LANES], xp, out, t0, ct, r0 + s * LANES,
                     min(2 * LANES, r1 - r0 - s * LANES))
                s += 2
            if s < nsub:
                _MK1(pk[s * kp * LANES:(s + 1) * kp * LANES], xp, out, t0, ct, r0 + s * LANES,
                     min(LANES, r1 - r0 - s * LANES))


def activation_pairs(x: np.ndarray) -> np.ndarray:
    """x float32 (n, K) -> its bf16 rounding (as ggml's from_float for BF16) as u32 pairs (n_pad, K/2),
    rows padded with zeros to a multiple of COLS."""
    n, kdim = x.shape
    r = np.empty((-(-n // COLS) * COLS, kdim), np.float32)
    round_half_rows(x, r[:n], True)
    r[n:] = 0
    hi = (r.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return hi.view(np.uint32).reshape(r.shape[0], kdim // 2)


def tile_rows(n_out: int, kdim: int, threads: int) -> int:
    """Rows per prange tile: a multiple of 32 packing to about TILE_BYTES, at least two tiles per thread
    where the matrix allows."""
    unit = 2 * LANES
    mr = unit * max(1, TILE_BYTES // (unit * 2 * kdim))
    per = -(-n_out // (2 * threads))
    return max(unit, min(mr, -(-per // unit) * unit))


def gemm_bf16(w: np.ndarray, x: np.ndarray, out: np.ndarray, threads: int, cache: dict) -> np.ndarray:
    """out = x @ w.T for BF16 weights w (uint8 (n_out, 2K), as the file holds them; K even) on vdpbf16ps;
    ``cache`` (a dict shared by the products of one x, as gemm.gemm_operands takes it) keeps x's pairs."""
    if "bf16_pairs" not in cache:
        cache["bf16_pairs"] = activation_pairs(x)
    _gemm_bf16(w.view(np.uint32), cache["bf16_pairs"], out, tile_rows(w.shape[0], x.shape[1], threads))
    return out
