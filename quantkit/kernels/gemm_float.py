"""Prefill GEMM for float weights (F32, F16, BF16) on x86 with AVX2 or AVX-512: register-blocked float32
FMAs, and BF16 on AVX512-BF16's ``vdpbf16ps`` (Zen 4 / 5, Sapphire Rapids, Cooper Lake).

ggml multiplies float weights with activations rounded to the weight's type (``vec_dot_type``: F16 ->
fp16, BF16 -> bf16, F32 as is); for a batch its llamafile sgemm (``ggml-cpu/llamafile/sgemm.cpp``,
``tinyBLAS``) runs register-blocked FMAs on the weights widened to float32, and on CPUs with AVX512-BF16
``_mm512_dpbf16_ps``, where each 32-bit lane holds two bf16 and one instruction adds both products to a
float32 accumulator -- twice what an fp32 FMA does. The dequantize + BLAS prefill (``mul_mat._prefill``)
measured 0.56x llama.cpp for BF16 and 0.82-0.92x for F16 on a Zen 4 (docs/performance.md). This module is
the integer GEMM's shape (kernels/gemm.py) in float:

* **Pack once per tile.** A thread's tile of weight rows is copied 16 rows at a time into ``[K'][16]``
  32-bit words, one 64-byte load per word index of 16 rows: ``fma``: word k is row r's element k as
  float32 (F16 widened by ``ld_f16``); ``bf16``: word k is row r's elements 2k and 2k + 1 as stored.
* **Micro-kernel** (2 sub-tiles of 16 rows x ``COLS`` tokens): per word index, 2 weight loads, one
  broadcast of each token's word, ``2 * COLS`` FMAs or ``vdpbf16ps``; lane r accumulates row r, no
  horizontal sums. The activations are x rounded as ggml rounds them (``round_half_rows``), float32 words
  for ``fma``, the bf16 upper halves in pairs for ``bf16``.

Each output is one float32 accumulator running over K in order, so results do not depend on the
thread count or on the tokens beside it; against a float64 product of the same rounded values the
error is float32 accumulation's (tests/test_gemm_float.py). ``vdpbf16ps`` flushes denormals to zero.
It is emitted as inline assembly: LLVM 22 types its intrinsic with ``bfloat`` vectors, which llvmlite's
IR builder lacks. At AVX-512 the 16 accumulators and the loads fit 32 ``zmm``; below it (16 ``ymm``) the
micro-kernel takes one sub-tile x 6 tokens (``COLS``: 12 ``ymm`` accumulators, 2 for the weights, 1 for
the broadcast token).
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from quantkit.formats.ggml_types import type_info
from quantkit.jit import addr_of, call_addr, frozen, prange, specialize, view_f32, view_i64, view_u8_ro, view_u32
from quantkit.kernels.activations import round_half_rows
from quantkit.kernels.cpu_traits import cpu_traits
from quantkit.kernels.gemm import LANES, TILE_BYTES, store_tile
from quantkit.kernels.ir import HAS_AVX512F, F32T, I32, I64, _byte_ptr, ld_u32

# numba sets up LLVM's native target and asm printer, not its asm parser, which inline assembly needs
llvm.initialize_native_asmparser()

#: tokens per micro-kernel call (rows per sub-tile: gemm.LANES, one zmm of float32 lanes; bytes of
#: packed weights per tile: gemm.TILE_BYTES): 8 with two sub-tiles at AVX-512; 6 with one below it (AVX2,
#: forced on the Sapphire Rapids machine, 1B-shape pp512 against 4 tokens: F16 67.5-68.2 -> 70.2-72.6 t/s,
#: BF16 71.9-73.3 -> 76.8-78.8)
COLS = 8 if HAS_AVX512F else 6
V16I32 = ir.VectorType(I32, 16)
V16F32 = ir.VectorType(F32T, 16)
_FM = ("contract",)


def words(t, op: str) -> tuple:
    """(the packed word's load from a row (``PACK``), its bytes of row, its dtype) of weight type ``t``
    with product ``op``: ``fma`` widens each element by the type's row load (its record's ``Row.fn``,
    ``ld_f16`` / ``ld_bf16`` / ``ld_f32``), ``bf16`` takes a stored pair as one 32-bit word."""
    if op == "bf16":
        return ld_u32, 4, np.uint32
    return cpu_traits(t).row.fn, type_info(t).type_size, np.float32


def _dpbf16(b, acc, w, x):
    """acc (<16 x float>) + per lane the two bf16 products of w's and x's 32-bit lanes (vdpbf16ps)."""
    fty = ir.FunctionType(V16F32, [V16F32, V16I32, V16I32])
    return b.asm(fty, "vdpbf16ps $3, $2, $0", "=v,0,v,v", [acc, w, x], False, name="dpbf16")


def _micro(ns: int, op: str, cols: int = COLS):
    """``mk(wp, xp, out, t0, ct, r0, nr)``: out[t0 + c, r0 + l] for c < ct (<= cols), l < nr (the ``ns``
    16-row sub-tiles of packed words ``wp``, the last may be partial) from the tokens' words ``xp``
    ((n_pad, K'), one per packed word index): float32 FMAs (``fma``) or ``vdpbf16ps`` (``bf16``)."""
    vt = V16F32 if op == "fma" else V16I32
    st = F32T if op == "fma" else I32

    def impl(typingctx, wp, xp, out, t0, ct, r0, nr):
        sig = types.void(wp, xp, out, t0, ct, r0, nr)

        def codegen(context, builder, signature, args):
            b = builder
            ta = signature.args
            zero = context.get_constant(types.intp, 0)
            wbase, xbase, obase = (_byte_ptr(context, b, ta[i], args[i], zero, types.intp) for i in range(3))
            t0_, ct_, r0_, nr_ = (context.cast(b, args[i], ta[i], types.intp) for i in range(3, 7))
            kw = cgutils.unpack_tuple(b, context.make_array(ta[1])(context, b, args[1]).shape)[1]
            n_out = cgutils.unpack_tuple(b, context.make_array(ta[2])(context, b, args[2]).shape)[1]
            c = lambda v: ir.Constant(I64, v)  # noqa: E731
            subs = [b.gep(wbase, [b.mul(b.mul(kw, c(64)), c(j))]) for j in range(ns)]
            toks = [b.add(t0_, c(t)) for t in range(cols)]
            xrows = [b.gep(xbase, [b.mul(b.mul(tk, kw), c(4))]) for tk in toks]
            accs = [[cgutils.alloca_once_value(b, ir.Constant(V16F32, None)) for _ in range(cols)] for _ in range(ns)]
            with cgutils.for_range(b, kw) as loop:
                k = loop.index
                ws = [b.load(b.bitcast(b.gep(s, [b.mul(k, c(64))]), vt.as_pointer()), align=1) for s in subs]
                for t in range(cols):
                    x = b.load(b.bitcast(b.gep(xrows[t], [b.mul(k, c(4))]), st.as_pointer()), align=1)
                    xv = b.insert_element(ir.Constant(vt, None), x, ir.Constant(I32, 0))
                    xv = b.shuffle_vector(xv, xv, ir.Constant(V16I32, [0] * 16))
                    for j, w in enumerate(ws):
                        a = b.load(accs[j][t])
                        a = (b.fadd(a, b.fmul(w, xv, flags=_FM), flags=_FM) if op == "fma" else _dpbf16(b, a, w, xv))
                        b.store(a, accs[j][t])
            store_tile(b, obase, accs, toks, ct_, r0_, nr_, n_out)
            return context.get_dummy_value()

        return sig, codegen

    impl.__name__ = f"gemm_float_micro_{ns}_{op}_{cols}"
    return intrinsic(impl)


def pack_word(row, k):
    """Packed word k of a weight row: ``LD`` (the type's load) at byte ``ES * k``."""
    return LD(row, ES * k)  # noqa: F821


#: a tile's C signature (``jit.call_addr``): the product's table (``P_*``), the tile's index, rows per
#: tile, the address of the tile's packed words (zeros), five unused
TILE_SIG = types.void(*([types.int64] * 10))
#: the product's table, int64 fields by index: the weights' address, rows, bytes a row, row stride; the
#: tokens' words' address, rows (padded to COLS) and words a row; the output's address and tokens
P_W, P_NOUT, P_RB, P_STRIDE, P_XP, P_NPAD, P_KW, P_OUT, P_NTOK, N_P = range(10)


def gemm_float_tile(pt, tile, mr, pkp, _u0, _u1, _u2, _u3, _u4, _u5):
    """Tile ``tile`` of the product described by the table at ``pt``: weight rows tile * mr .. + mr
    (rows of ``K'`` words, ``PACK`` reading word k) packed into the zeroed words at ``pkp``, then multiplied
    with every group of NCOL tokens' words (``XV``: their view). A ``cfunc`` of TILE_SIG per type and
    product, which ``gemm_float_body`` -- built once for every type -- calls per tile."""
    p = view_i64(pt, N_P)
    n_out, kw, n_tok = p[P_NOUT], p[P_KW], p[P_NTOK]
    w = view_u8_ro(p[P_W], n_out * p[P_STRIDE]).reshape((n_out, p[P_STRIDE]))[:, :p[P_RB]]
    xp = XV(p[P_XP], p[P_NPAD] * kw).reshape((p[P_NPAD], kw))  # noqa: F821
    out = view_f32(p[P_OUT], n_tok * n_out).reshape((n_tok, n_out))
    r0 = tile * mr
    r1 = min(r0 + mr, n_out)
    nsub = (r1 - r0 + LANES - 1) // LANES  # noqa: F821
    pk = PKV(pkp, nsub * kw * LANES)  # noqa: F821
    for s in range(nsub):
        base = s * kw * LANES  # noqa: F821
        for r in range(min(LANES, r1 - r0 - s * LANES)):  # noqa: F821
            row = w[r0 + s * LANES + r]  # noqa: F821
            for k in range(kw):
                pk[base + k * LANES + r] = PACK(row, k)  # noqa: F821
    for t0 in range(0, n_tok, NCOL):  # noqa: F821
        ct = min(NCOL, n_tok - t0)  # noqa: F821
        s = 0
        while PAIRS and s + 1 < nsub:  # noqa: F821
            MK2(pk[s * kw * LANES:(s + 2) * kw * LANES], xp, out, t0, ct, r0 + s * LANES,  # noqa: F821
                min(2 * LANES, r1 - r0 - s * LANES))  # noqa: F821
            s += 2
        while s < nsub:  # the odd last sub-tile; every sub-tile without PAIRS
            MK(pk[s * kw * LANES:(s + 1) * kw * LANES], xp, out, t0, ct, r0 + s * LANES,  # noqa: F821
               min(LANES, r1 - r0 - s * LANES))  # noqa: F821
            s += 1


def gemm_float_body(tile, w, xp, out, mr):
    """out (n_tok, n_out) = weights w (uint8 rows) x the tokens' words xp ((n_pad, K'), rows padded to a
    multiple of COLS) by the type's tile at address ``tile`` (``gemm_float_tile``): prange over tiles
    of ``mr`` rows (a multiple of 32), each with its own zeroed words. One build for every type and
    product (per argument types), as gemm.gemm_body."""
    n_out = w.shape[0]
    kw = xp.shape[1]
    pt = np.empty(N_P, np.int64)
    pt[P_W], pt[P_NOUT], pt[P_RB], pt[P_STRIDE] = addr_of(w), n_out, w.shape[1], w.strides[0]
    pt[P_XP], pt[P_NPAD], pt[P_KW] = addr_of(xp), xp.shape[0], kw
    pt[P_OUT], pt[P_NTOK] = addr_of(out), out.shape[0]
    for i in prange((n_out + mr - 1) // mr):
        r0 = i * mr
        nsub = (min(r0 + mr, n_out) - r0 + LANES - 1) // LANES
        pk = np.zeros(nsub * kw * LANES, np.uint32)
        call_addr(tile, addr_of(pt), i, mr, addr_of(pk), 0, 0, 0, 0, 0, 0)


_KERNELS: dict = {}


def _kernel(t, op: str):
    """The GEMM of float type ``t`` with product ``op``: ``gemm_float_body`` bound to the type's tile. At
    AVX-512 (32 zmm): pairs of 16-row sub-tiles x COLS (8) tokens, 16 accumulators; below it (16 ymm,
    each <16 x float> two of them): one sub-tile x COLS (6) tokens, 12 ymm accumulators."""
    from quantkit.kernels.vecdot import build

    key = (T(t), op, HAS_AVX512F)
    if key not in _KERNELS:
        ld, es, word = words(*key[:2])
        tag = f"{key[0].name}_{op}"
        tile = specialize(gemm_float_tile, f"{tag}_{COLS}", fast=True, cfunc=TILE_SIG,
                          PACK=build(pack_word, tag, False, LD=ld, ES=es),
                          PKV=view_f32 if word == np.float32 else view_u32,
                          XV=view_f32 if op == "fma" else view_u32,
                          MK=_micro(1, op), MK2=_micro(2, op), PAIRS=HAS_AVX512F, LANES=LANES, NCOL=COLS)
        _KERNELS[key] = (tile, functools.partial(specialize(gemm_float_body, "all", parallel=True, fast=True),
                                                 tile.address))
    return _KERNELS[key][1]


def activation_words(x: np.ndarray, t, op: str) -> np.ndarray:
    """x float32 (n, K) -> the micro-kernel's token words for weight type ``t`` and product ``op``, rows
    padded with zeros to a multiple of COLS: x rounded to fp16 (F16) or bf16 (BF16) as ggml's from_float
    rounds it, as float32 words (``fma``) or the bf16 upper halves in pairs (``bf16``: u32 (n_pad, K/2))."""
    n, kdim = x.shape
    r = np.zeros((-(-n // COLS) * COLS, kdim), np.float32)
    if t == T.F32:
        r[:n] = x
        return r
    round_half_rows(x, r[:n], t == T.BF16)
    if op == "fma":
        return r
    hi = (r.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return hi.view(np.uint32).reshape(r.shape[0], kdim // 2)


def tile_rows(n_out: int, kdim: int, threads: int) -> int:
    """Rows per prange tile: a multiple of 32 packing to about TILE_BYTES (4 bytes a weight: the widest
    packing), at least two tiles per thread where the matrix allows."""
    unit = 2 * LANES
    mr = unit * max(1, TILE_BYTES // (unit * 4 * kdim))
    per = -(-n_out // (2 * threads))
    return max(unit, min(mr, -(-per // unit) * unit))


def gemm_float(w: np.ndarray, t, x: np.ndarray, out: np.ndarray, threads: int, cache: dict,
               op: str) -> np.ndarray:
    """out = x @ w.T for float weights w (uint8 (n_out, row bytes), as the file holds them; ``bf16``: K
    even) of type ``t`` with product ``op`` (``cpu_traits.float_gemm``); ``cache`` (a dict shared by the
    products of one x, as gemm.gemm_operands takes it) keeps x's words."""
    t = T(t)
    key = ("float_words", t, op)
    if key not in cache:
        cache[key] = activation_words(x, t, op)
    # weights read-only, as the file's map gives them: one build whoever calls (jit.frozen)
    _kernel(t, op)(frozen(w), cache[key], out, tile_rows(w.shape[0], x.shape[1], threads))
    return out
