"""``matmul`` (decode GEMV and prefill GEMM) and ``get_rows`` over raw GGUF weight bytes."""

from __future__ import annotations


import numpy as np
from gguf import GGMLQuantizationType as T

from quantkit import config
from quantkit.errors import QuantError
from quantkit.jit import _blas, blas_one_thread, frozen, get_threads  # noqa: F401 (blas_one_thread: callers import it here)
from quantkit.kernels import gemm as _gemm
from quantkit.kernels import gemm_float as _gemm_float
from quantkit.kernels.cpu_traits import cpu_traits, float_gemm, kind_of
from quantkit.kernels.ir import default_variant, gemm_flavour, int8_flavour
from quantkit.kernels.activations import round_half_rows, round_trip_q8_into
from quantkit.kernels.runners import gemv_kernel
from quantkit.kernels.vecdot import activation_kind, deq_rows_kernel, get_rows_kernel
from quantkit.quants import TRAITS, resolve_type

#: from this many tokens on, matmul dequantizes weight tiles and multiplies with BLAS
PREFILL_MIN_TOKENS = 32
#: from this many tokens on, a quantized weight goes to the integer GEMM (kernels/gemm.py) where the CPU
#: has it. At 16 tokens it already took 0.5-0.8x the GEMV's CPU time (2048-wide Q4_0 / Q4_K / Q6_K, 1
#: thread), but the threshold stays where the batch path always began: below it a token's logits do not
#: depend on the tokens beside it (the GEMV is per token, bit for bit), which the model tests rely on.
GEMM_MIN_TOKENS = PREFILL_MIN_TOKENS
#: weight rows per prange chunk in the GEMV
CHUNK_ROWS = 16
#: weight rows dequantized per BLAS call in the prefill path
TILE_ROWS = 256
#: a matrix whose float32 copy is at most this big is dequantized whole (one BLAS call)
TILE_BYTES = 8 << 20

_GEMV: dict = {}


_BLAS_DETERMINISTIC: bool | None = None


def blas_threads_deterministic() -> bool:
    """Whether this process's BLAS gives the same float32 products on 1 thread as on several.

    OpenBLAS normally does (its threads split the output, not the sums), but not always: forced to a
    foreign kernel (``OPENBLAS_CORETYPE=Haswell`` on a Zen 5 CPU, as some environments set it) its
    results changed with the thread count (measured on SmolLM2's product shapes). Probed once, on
    such shapes, with threadpoolctl."""
    global _BLAS_DETERMINISTIC
    if _BLAS_DETERMINISTIC is None:
        n = max(2, get_threads())
        rng = np.random.default_rng(0)
        same = True
        for m, k, o in ((64, 576, 1536), (48, 1536, 576)):
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((o, k), dtype=np.float32)
            with _blas().limit(limits=1, user_api="blas"):
                one = a @ b.T
            with _blas().limit(limits=n, user_api="blas"):
                same = same and np.array_equal(one, a @ b.T)
        _BLAS_DETERMINISTIC = same
    return _BLAS_DETERMINISTIC


def blas_limit():
    """Context manager: BLAS limited to numba's thread count (threadpoolctl), for a caller's own
    numpy matrix products around or between ``matmul`` calls; to one thread where the BLAS's results
    would depend on its thread count (``blas_threads_deterministic``), so that ours never do."""
    n = get_threads()
    if n > 1 and not blas_threads_deterministic():
        n = 1
    return _blas().limit(limits=n, user_api="blas")


def _check(w, wtype, where):
    t = resolve_type(wtype)
    if t not in TRAITS:  # a type with a codec and no fast kernel runs on the portable path
        raise QuantError(f"{where}: weight type {t.name} is not supported by quantkit yet (no codec); have "
                         f"{', '.join(x.name for x in TRAITS)}")
    if not isinstance(w, np.ndarray) or w.dtype != np.uint8 or w.ndim != 2:
        raise QuantError(f"{where}: weights must be a 2-D uint8 array (n_out, row_bytes), got "
                         f"{getattr(w, 'dtype', type(w))} {getattr(w, 'shape', '')}")
    if not w.flags.c_contiguous:
        raise QuantError(f"{where}: weights of shape {w.shape} must be C-contiguous")
    bs, ts = TRAITS[t].block_size, TRAITS[t].type_size
    if w.shape[1] % ts:
        raise QuantError(f"{where}: {w.shape[1]} bytes per row is not a multiple of {t.name}'s "
                         f"{ts}-byte block")
    return t, w.shape[1] // ts * bs


def matmul(w: np.ndarray, wtype, x: np.ndarray, out: np.ndarray | None = None,
           rounded: dict | None = None) -> np.ndarray:
    """y = x @ dequantize(w).T : w uint8 (n_out, row_bytes) of ``wtype`` (a GGUF 2-D tensor, ne1 =
    n_out rows of ne0 = n_in), x float32 (n_tok, n_in) -> float32 (n_tok, n_out), into ``out`` if given.

    Few tokens: x is quantized once to the type's vec_dot type and each weight row is dotted with
    integer block products (GEMV). From GEMM_MIN_TOKENS, quantized weights on an AVX2 or better x86 level: the
    same activations and integer math in a register-blocked GEMM (kernels/gemm.py); float weights on an
    x86 level (AVX2 or AVX-512): the activations rounded as ggml does in a float GEMM
    (kernels/gemm_float.py; BF16 on ``vdpbf16ps`` where the CPU has it). Otherwise from
    PREFILL_MIN_TOKENS: x is rounded the same way (quantized and decoded back), tiles of TILE_ROWS weight
    rows are dequantized to float32 and multiplied with BLAS. Results do not depend on the thread count.

    ``rounded``: a dict shared by products of the same ``x`` (Q, K and V; gate and up): the prefill
    keeps x's rounded forms there, so each is computed once. Pass a fresh dict for a new x."""
    t, n_in = _check(w, wtype, "matmul")
    w = frozen(w)
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != n_in:
        raise QuantError(f"matmul: activations of shape {x.shape} do not fit {t.name} weights of "
                         f"{w.shape[0]} x {n_in}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_tok, n_out = x.shape[0], w.shape[0]
    if out is None:
        out = np.empty((n_tok, n_out), np.float32)
    elif out.shape != (n_tok, n_out) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise QuantError(f"matmul: out must be C-contiguous float32 of shape {(n_tok, n_out)}")
    if n_tok == 0 or n_out == 0:
        return out
    if n_tok >= GEMM_MIN_TOKENS and integer_gemm(t):
        return _gemm.gemm(w, t, x, out, {} if rounded is None else rounded, get_threads(),
                          gemm_flavour(default_variant()))
    if n_tok >= GEMM_MIN_TOKENS and (op := float_gemm(t)):
        return _gemm_float.gemm_float(w, t, x, out, get_threads(), {} if rounded is None else rounded, op)
    if n_tok >= PREFILL_MIN_TOKENS:
        return _prefill(w, t, x, out, {} if rounded is None else rounded)
    variant = default_variant()
    key = (t, variant)
    gemv = _GEMV.get(key)
    if gemv is None:
        gemv = _GEMV[key] = gemv_kernel(t, variant)
    gemv(w, x, out, CHUNK_ROWS)
    return out


_ROUND_TRIP_KIND = {"Q8_0": 1, "Q8_1": 1, "Q8_K": 2}


def _rounded_half(bf16: bool):
    def rnd(x):
        out = np.empty_like(x)
        round_half_rows(x, out, bf16)
        return out
    return rnd


#: weight type -> rounding of the activations to its vec_dot type (ggml-cpu's type_traits_cpu)
_HALF_ACTIVATIONS = {T.F16: _rounded_half(False), T.BF16: _rounded_half(True)}


def integer_gemm(t) -> bool:
    """Whether batches of weight type ``t`` run on integer dots (kernels/gemm.py): a quantized type,
    an integer-dot flavour for the 16-row tiles (``ir.int8_flavour``: AVX512-VNNI, AVX-VNNI, AVX2 or
    NEON with the dot product; not generic or plain), and not ``QUANTKIT_GEMM=0`` (the switch back to the dequantize + BLAS
    prefill). Both paths round the activations as ggml does; their results differ
    in float summation order only, and both sit inside llama.cpp's own spread between its
    configurations (docs/imatrix-perplexity.md, "Agreement noise")."""
    return kind_of(t, "gemm") == "gemm" and int8_flavour(default_variant()) is not None and config.integer_gemm()


def _prefill(w, t, x, out, rounded):
    n_out, n_in = out.shape[1], x.shape[1]
    kind = _ROUND_TRIP_KIND.get(activation_kind(t, "vnni"))
    key = t if t in _HALF_ACTIVATIONS else kind
    if key in rounded:
        x = rounded[key]
    elif t in _HALF_ACTIVATIONS:  # F16 / BF16 weights: activations rounded to that type (the row dots do too)
        x = rounded[key] = _HALF_ACTIVATIONS[t](x)
    elif kind is not None:  # the activation rounding ggml's batches get, then exact float products
        xr = np.empty_like(x)
        round_trip_q8_into(x, kind, xr, 32)
        x = rounded[key] = xr
    if t != T.F32 and not blas_threads_deterministic():   # at 1 thread too: the same products
        return _tiles_on_threads(w, t, x, out, get_threads())
    with blas_limit():
        if t == T.F32:
            np.matmul(x, w.view(np.float32).T, out=out)
            return out
        deq = deq_rows_kernel(t)
        # whole matrix in one BLAS call when its float32 copy fits TILE_BYTES, else TILE_ROWS-row tiles
        rows = n_out if n_out * n_in * 4 <= TILE_BYTES else max(TILE_ROWS, TILE_BYTES // (4 * n_in))
        tile = np.empty((min(rows, n_out), n_in), np.float32)
        if rows >= n_out:
            deq(w, 0, tile)
            np.matmul(x, tile.T, out=out)
            return out
        part = np.empty((x.shape[0], tile.shape[0]), np.float32)
        for r0 in range(0, n_out, rows):
            r1 = min(r0 + rows, n_out)
            tl = tile[: r1 - r0]
            deq(w, r0, tl)
            p = part[:, : r1 - r0]
            np.matmul(x, tl.T, out=p)
            out[:, r0:r1] = p
    return out


def _tiles_on_threads(w, t, x, out, threads):
    """``_prefill``'s products where this BLAS must run on one thread (its results change with its
    thread count: ``blas_threads_deterministic``): the weight rows in tiles whose size depends on the
    shape alone, each tile's product one single-threaded BLAS call, ``threads`` of them at a time on
    threads of their own. So the results are the same at any thread count (every product is the same
    call) and every core works: an F16 imatrix under ``QUANTKIT_KERNELS=avx2`` (OpenBLAS held to its
    Haswell kernels, not thread-count deterministic on the Sapphire Rapids machine) had run on one core.
    Between batches the tiles are dequantized by the parallel numba kernel, in this thread."""
    from concurrent.futures import ThreadPoolExecutor

    n_out, n_in = out.shape[1], x.shape[1]
    rows = max(TILE_ROWS, TILE_BYTES // (4 * n_in))
    rows = min(rows, -(-n_out // 2))                       # two tiles at least, whatever the thread count
    starts = list(range(0, n_out, rows))
    tiles = [np.empty((rows, n_in), np.float32) for _ in range(max(1, min(threads, len(starts))))]
    parts = [np.empty((x.shape[0], rows), np.float32) for _ in tiles]
    deq = deq_rows_kernel(t)

    def product(k, r0):
        r1 = min(r0 + rows, n_out)
        np.matmul(x, tiles[k][: r1 - r0].T, out=parts[k][:, : r1 - r0])
        out[:, r0:r1] = parts[k][:, : r1 - r0]

    with blas_one_thread(), ThreadPoolExecutor(len(tiles)) as pool:
        for g in range(0, len(starts), len(tiles)):
            batch = starts[g:g + len(tiles)]
            for k, r0 in enumerate(batch):
                deq(w, r0, tiles[k][: min(rows, n_out - r0)])
            list(pool.map(product, range(len(batch)), batch))
    return out


def get_rows(w: np.ndarray, wtype, ids) -> np.ndarray:
    """Embedding lookup: float32 (len(ids), n_in), dequantizing only the rows ``ids`` of ``w``."""
    t, n_in = _check(w, wtype, "get_rows")
    w = frozen(w)
    ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
    if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
        raise QuantError(f"get_rows: ids must be in [0, {w.shape[0]}), got {ids.min()}..{ids.max()}")
    out = np.empty((ids.size, n_in), np.float32)
    if ids.size:
        get_rows_kernel(t)(w, ids, out)
    return out
