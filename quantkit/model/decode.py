"""The decode step in compiled code: one numba call per generated token runs every layer.

``DecodeStep(model, n_embd_max...)`` turns a ``Llama`` into flat tables once, and ``step(...)`` runs
one token: embedding row, then per layer RMSNorm, activation quantization (once per distinct input
and activation kind), Q/K/V products, ``qk_prepare`` (biases, Q/K norms, RoPE), KV store, attention
over the cache (or its sliding window), output product, (post-norm,) residual, RMSNorm, gate/up
products with the GLU (SiLU or GELU), down product, (post-norm,) residual -- or, in a mixture-of-experts
layer, the router product, ``moe_route`` (softmax, top-k, normalized weights) and those three products
for each chosen expert alone, their weighted outputs added in selection order --; then the final norm
and the logits product (quantkit.model.arch's layer, as each layer's ``quantkit.model.layer.Layer``
record says). No Python runs between layers (docs/kernels.md: per-layer
Python work over 30 layers costs more than the products of a small model).

How the weights get in, and the type dispatch:

* Every matrix is a byte range of one flat ``uint8`` buffer: the GGUF file's memory map itself (no
  second copy of the weights: the process holds the file's pages and nothing more). The map is advised
  for transparent huge pages (``formats.gguf_io``), and where the page cache holds the file in 2 MiB
  folios the kernel maps them with 2 MiB entries. An earlier machine (4 KiB file mappings only) decoded
  ~20% slower from the map than from a huge-page anonymous copy; on the 1B shape here the two measured
  the same (docs/performance.md), so the copy, which doubled the peak memory while it was made, is now
  opt-in: ``QUANTKIT_COPY_WEIGHTS=1`` (when the span is at most ``RAM_COPY_FRACTION`` of the available
  memory; the file's pages are then dropped). Two kinds of matrix are read from a copy of their own in
  ``pbuf`` instead (``make_x8``, a slice at a time, each slice's file pages released once copied, so the
  resident bytes stay one copy): the x8 types' in the 8-row interleaved layout, and float weights as the
  file's rows (``runners.copies_rows``: on the Sapphire Rapids machine they decoded ~11 % slower from
  the map). ``wt[layer, j] = (offset, row_bytes, n_rows, code, chunk
  rows, expert stride)`` for the eight matrices of a layer in ``MATS`` order (``MOE_MATS`` in a MoE
  layer: a 3D expert tensor is one entry of one expert's rows, expert e at offset + e * stride; a
  dense layer's eighth entry is empty); ``ot`` / ``et`` the same for ``output`` and ``token_embd``.
* ``code`` indexes the model's *type set* (its distinct matrix types and layouts, at most ``SLOTS``):
  ``runs[code]`` is the address of that slot's row runner, a C-callable build of one type and layout
  (kernels/runners.py), which the step calls (``jit.call_addr``) once per chunk of rows (``deqs[code]``
  the embedding lookup's). The step is
  therefore built once for every model (per KV cache kind), and a type's runner once for every model
  that has it.
* Each runner has one uniform signature of integers (``RUN_SIG``): the activation table's address
  (``act_table``: every activation form of one input vector -- float32, Q8_0 quants/scales/sums, Q8_1
  float sums, Q8_K quants/scales/bsums), from which it views the forms its type's dot wants
  (``activation_kind``: the type's vec_dot type). Before a product the step quantizes the input only to
  the kinds its consumers need (``need`` bit masks, computed here from the types).

Parallelism: each product is split into chunks of ``chunk_rows`` output rows (Q, K and V in one
region; gate and up in one region that also applies the GLU to its own rows), and the threads of a
``prange`` claim them one at a time from a shared counter (``jit.fetch_add``), as ggml's threadpool
does: a thread that runs slower -- on this project's 2-vCPU Zen 4 host one often did, for hundreds of
milliseconds -- takes fewer chunks instead of holding the others at the region's end, as a fixed split
did (1B Q4_K_M, 2 threads: tg 0.72 -> 0.83 of llama-bench's, medians of interleaved rounds). The
attention is a ``prange`` over heads. Each output element is computed by one thread with the same code,
so the logits do not depend on the thread count or on which thread took a chunk. Everything else
(norms, quantization, RoPE) runs on the calling thread.

The KV cache is passed in as ``uint16`` (fp16 bits, as llama.cpp's default f16 cache) or float32;
one body is built for each (``ST_KV``, and ``attend_kernel``'s ``LD_KV``).
"""

from __future__ import annotations

import mmap

import numpy as np

from quantkit import config
from quantkit.errors import ModelError

from quantkit.jit import addr_of, call_addr, fetch_add, frozen, get_threads, njit_fast, njit_fast_parallel, prange
from quantkit.kernels import activation_kind, default_variant, quantize_q8_01_into, quantize_q8_k_into
from quantkit.kernels.activations import round_bf16_into, round_f16_into
from quantkit.kernels.runners import SC_LEN, act_table, copies_rows, deq_runner, row_runner
from quantkit.kernels.vecdot import X8_ROWS, build, pack_x8, x8_types
from quantkit.model.arch import GLU_KINDS
from quantkit.model.layer import DenseFFN, MoeFFN
from quantkit.model.llama import Llama, Weight
# the ops the step calls; exp_shift_sum, expf, gelu_table, max_f32 are re-exported (the batch path, perplexity)
from quantkit.model.ops import NO_SINK, add_bias
from quantkit.model.ops import (add_block, attend_kernel, exp_shift_sum, expf, gelu_table, glu, kv_f16_load,  # noqa: F401
                                kv_f16_store, kv_f32_same, max_f32, qk_prepare, rmsnorm1, window_start)

#: the seven matrices of a layer, in the order of ``wt[layer]``
MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
#: a MoE layer's: the experts' 3D tensors in the FFN's places, and the router
MOE_MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
            "ffn_gate_inp")
#: after them, a shared expert's (qwen2moe)
SHEXP_MATS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
#: columns of a ``wt`` row
WT_COLS = 6
#: distinct matrix types a model may have for the compiled step (more: the batch path decodes)
SLOTS = 8
#: output rows per prange chunk: a matrix's rows / CHUNK_SPLIT, a multiple of 16 in [16, CHUNK_MAX]. Each
#: chunk is a call with the activation tuple; at 16 rows those calls cost 25 % of the 1B shape's Q4_K_M
#: step (CPU ms per token, 1 thread: 30.5 at 16 rows, 26.4 at 64, 25.2 at 256); numba's OpenMP
#: schedule gives each thread one contiguous range of chunks, so larger ones do not unbalance threads
#: while a matrix keeps CHUNK_SPLIT of them.
CHUNK_SPLIT, CHUNK_MAX = 16, 256


def chunk_rows(n_rows: int) -> int:
    """Rows per prange chunk of a matrix of ``n_rows`` rows (a multiple of 16, so of the x8 groups)."""
    return min(CHUNK_MAX, max(16, n_rows // CHUNK_SPLIT // 16 * 16))


#: the slot of ``DecodeStep.ctr`` that counts a product's claimed chunks: 512 bytes from the array's
#: start and end, so no other data shares its cache line, which both threads write
CTR = 64
#: ``DecodeStep.make_x8`` packs a matrix this many bytes of rows at a time, releasing each slice's file
#: pages before the next: the packing's transient is one slice, not the largest matrix (8B's output)
X8_SLICE_BYTES = 4 << 20
#: the weights are copied to huge-page memory when their span is at most this fraction of MemAvailable
RAM_COPY_FRACTION = 0.5
#: activation kind -> bit in the ``need`` masks (F32 needs no conversion)
KIND_BIT = {"Q8_0": 1, "Q8_1": 2, "Q8_K": 4, "F32": 0, "F16": 8, "BF16": 16}


# -- rows of a weight . one input vector ----------------------------------------------------------
# a = the activation forms of one input vector, in the order of kernels/runners.py's activation table:
# (x f32, q8 int8, q8 d f32, q8_0 sums i32, q8_1 sums f32, q8k int8, q8k d f32, q8k bsums i32, x rounded
# to fp16, x rounded to bf16), each (1, n_in); ``act_table`` gives their addresses.
#
# The step calls a matrix's row runner (kernels/runners.py) through a table of function pointers
# indexed by the matrix's slot (``runs[code]``), so the step itself is built once for every model (per
# KV cache kind), not once per set of matrix types (a 135M model makes ~4,000 such calls a token).

@njit_fast
def rows(runs, m, c, bp, pp, ap, op, o0, sp):
    """Chunk c of the product of the matrix ``m`` (a row of ``wt``: offset, bytes a row -- or an x8
    row group --, rows, slot, chunk rows) with the activations at ``ap``: out[o0 + r] for its rows r,
    by the slot's runner ``runs[m[3]]``."""
    r0 = np.int64(c) * m[4]  # a prange index may be unsigned: uint64 * int64 would give float64
    call_addr(runs[m[3]], bp, pp, m[0], m[1], r0, min(r0 + m[4], m[2]), ap, op, o0, sp)


@njit_fast(inline="always")
def nchunks(m):
    """Chunks of the matrix ``m`` (a ``wt`` row) in its products."""
    return (m[2] + m[4] - 1) // m[4]


@njit_fast_parallel
def product(runs, m, bp, pp, ap, op, sp, ctr, nth):
    """out = the matrix ``m`` (a ``wt`` row) . a, over ``nth`` threads that claim its chunks from the
    counter ``ctr[CTR]`` as each becomes free."""
    o_0 = np.int64(0)
    ctr[CTR] = 0
    for _ in prange(nth):
        c = fetch_add(ctr, CTR, 1)
        while c < nchunks(m):
            rows(runs, m, c, bp, pp, ap, op, o_0, sp)
            c = fetch_add(ctr, CTR, 1)


# -- the activation forms a product needs ----------------------------------------------------------

@njit_fast
def quantize_needed(mask, a):
    """Fill the activation forms of a[0] that ``mask`` asks for (KIND_BIT)."""
    if mask & 3:  # Q8_0 quants, scales and int sums; with Q8_1 also ggml's fp16 s
        quantize_q8_01_into(a[0], a[1], a[2], a[3], a[4], (mask & 2) != 0)
    if mask & 4:
        quantize_q8_k_into(a[0], a[5], a[6], a[7])
    if mask & 8:
        round_f16_into(a[0], a[8])
    if mask & 16:
        round_bf16_into(a[0], a[9])


# -- the step ---------------------------------------------------------------------------------------

@njit_fast
def softmax_inplace(x, n):
    """x[:n] <- ggml_soft_max of x[:n] (float32 exp, float64 sum, times 1 / sum)."""
    mx = max_f32(x, n)
    tot = 0.0
    for i in range(n):
        e = expf(x[i] - mx)
        x[i] = e
        tot += np.float64(e)
    inv = np.float32(1.0) / np.float32(tot)
    for i in range(n):
        x[i] *= inv


@njit_fast
def moe_route(logits, k, norm_w, weight_softmax, sel, selw):
    """build_moe_ffn's routing of one token (as ``forward.route``; ``logits`` is overwritten): gating
    softmax, the softmax of the router logits; the k largest into sel[:k] (a strict > scan: ties to the
    lower index), their values into selw -- with ``weight_softmax`` (gpt-oss's softmax_weight gating)
    the k largest logits, selw then their softmax --, divided by their float32 sum (clamped below at
    6.103515625e-5) when ``norm_w``."""
    n = logits.shape[0]
    if not weight_softmax:
        softmax_inplace(logits, n)
    for j in range(k):
        best = 0
        for i in range(1, n):
            if logits[i] > logits[best]:
                best = i
        sel[j] = best
        selw[j] = logits[best]
        logits[best] = np.float32(-np.inf)
    if weight_softmax:
        softmax_inplace(selw, k)
    if norm_w:
        s = np.float32(0.0)
        for j in range(k):
            s += selw[j]
        s = max(s, np.float32(6.103515625e-5))
        for j in range(k):
            selw[j] = selw[j] / s


def step_body(tok, pos, want, runs, deqs, buf, pbuf, wt, ot, et, attn_norm, ffn_norm, out_norm, cos, sin, kc, vc, need,
              aE, aQ, aF, x, xb2, qkv, hg, hu, scores, logits, sc, ctr, nth, dims, eps, scale, lay, bias, qk_norm,
              post_norm, gelu_tab, embd_scale, moe, attn_x, atab):
    """Run token ``tok`` at position ``pos`` through every layer; the logits into ``logits`` when
    ``want``. Matrices are read from ``buf`` (the file's map) or, for x8 slots, ``pbuf``, by the row
    runners ``runs[slot]`` (the embedding's row by ``deqs[slot]``); ``atab`` (4, 20): the activation
    tables (``act_table``) of aE, aQ, aF and the shared expert's. kc/vc (n_layer, n_ctx, n_head_kv*head_dim) get this position's K and V.
    dims = (n_head, n_head_kv, head_dim, n_rot, neox, glu kind, has qk norms, has post norms, experts used
    (0: a dense FFN), normalize the experts' weights, has a shared expert, softmax_weight gating);
    moe = (router logits (n_expert,), one expert's output (n_embd,), the chosen experts' weights and
    indices (experts used,), the three expert matrices' ``wt`` rows (3, WT_COLS)) -- scratch --, the
    shared expert's gate vectors (n_layer, n_embd) and the activation forms of its down product's input,
    the router's biases (n_layer, n_expert), the experts' gate, up and down biases (n_layer, n_expert,
    n_ff or n_embd) (each (n_layer, 0, ...) when there are none); a shared expert's three matrices are
    ``wt[l, 8:11]``; attn_x = (sink logits (n_layer, n_head), attn_output biases (n_layer, n_embd)),
    each (n_layer, 0) when there are none;
    need[l] = activation kinds of the four inputs of layer l (attn, attn_output, ffn, ffn_down),
    need[n_layer, 0] the output's; lay[l] = (RoPE table of cos / sin, sliding window or 0);
    bias[l] = the Q, K, V biases (n_layer, 0) when there are none; qk_norm[l] = (q, k) head norms,
    post_norm[l] = (attention, FFN) output norms (each (n_layer, 0, ...) when the arch has none)."""
    n_layer = wt.shape[0]
    n_head, n_head_kv, hd, n_rot, neox, glu_kind = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    has_qkn = dims[6] != 0
    E = x.shape[0]
    Q = n_head * hd
    KV = n_head_kv * hd
    group = n_head // n_head_kv
    n_kv = pos + 1
    nob = bias[0, :0]       # an empty bias / norm: "none"
    xa = aE[0][0]           # the normed input of a block, float32 (E,)
    xo = aQ[0][0]           # the attention output, float32 (Q,)
    o_0 = np.int64(0)       # output offset 0, typed int64 as Q and Q + KV are (one build of ROWS)
    n_used = dims[8]
    norm_w = dims[9] != 0
    rlog, ye, selw, sel, mrow, shg, aS = moe[0], moe[1], moe[2], moe[3], moe[4], moe[5], moe[6]
    rbias, gbias, ubias, dbias = moe[7], moe[8], moe[9], moe[10]
    has_shexp = 1 if dims[10] != 0 else 0
    weight_softmax = dims[11] != 0
    sinks, obias = attn_x[0], attn_x[1]
    has_sinks = sinks.shape[1] != 0
    has_eb = gbias.shape[1] != 0
    bp, pp, sp = addr_of(buf), addr_of(pbuf), addr_of(sc)
    aEp, aQp, aFp, aSp = addr_of(atab[0]), addr_of(atab[1]), addr_of(atab[2]), addr_of(atab[3])
    qkvp, hgp, hup, xb2p, yep = addr_of(qkv), addr_of(hg), addr_of(hu), addr_of(xb2), addr_of(ye)

    call_addr(deqs[et[3]], bp, pp, et[0], et[1], np.int64(tok), np.int64(tok) + 1, aEp, addr_of(x), o_0, sp)
    if embd_scale != np.float32(1.0):
        for i in range(E):
            x[i] *= embd_scale
    for l in range(n_layer):
        w = wt[l]
        # -- attention: norm, Q/K/V (one parallel region), biases + q/k norms + RoPE, cache store, attend,
        # project, (post-norm), add
        rmsnorm1(x, attn_norm[l], eps, xa)
        quantize_needed(need[l, 0], aE)
        cq, ck, cv = nchunks(w[0]), nchunks(w[1]), nchunks(w[2])
        ctr[CTR] = 0
        for _ in prange(nth):
            c = fetch_add(ctr, CTR, 1)
            while c < cq + ck + cv:
                if c < cq:
                    rows(runs, w[0], c, bp, pp, aEp, qkvp, o_0, sp)
                elif c < cq + ck:
                    rows(runs, w[1], c - cq, bp, pp, aEp, qkvp, Q, sp)
                else:
                    rows(runs, w[2], c - cq - ck, bp, pp, aEp, qkvp, Q + KV, sp)
                c = fetch_add(ctr, CTR, 1)
        bl = bias[l]
        has_b = bl.shape[0] != 0
        qkv_q = qkv[:Q]
        qkv_k = qkv[Q:Q + KV]
        qkv_v = qkv[Q + KV:]
        qk_prepare(qkv_q, qkv_k, qkv_v, bl[:Q] if has_b else nob, bl[Q:Q + KV] if has_b else nob,
                   bl[Q + KV:] if has_b else nob, qk_norm[l, 0] if has_qkn else nob,
                   qk_norm[l, 1] if has_qkn else nob, eps, n_head, n_head_kv, hd, n_rot,
                   cos[lay[l, 0], pos], sin[lay[l, 0], pos], neox != 0)
        krow = kc[l, pos]
        vrow = vc[l, pos]
        for i in range(KV):
            krow[i] = ST_KV(qkv_k[i])  # noqa: F821
            vrow[i] = ST_KV(qkv_v[i])  # noqa: F821
        kl = kc[l]
        vl = vc[l]
        k0 = window_start(n_kv, lay[l, 1])
        for h in prange(n_head):
            snk = sinks[l, h] if has_sinks else np.float32(NO_SINK)
            ATTEND(qkv[h * hd:(h + 1) * hd], kl, vl, (h // group) * hd, k0, n_kv, scale, snk,  # noqa: F821
                   scores[h], xo[h * hd:(h + 1) * hd])
        quantize_needed(need[l, 1], aQ)
        product(runs, w[3], bp, pp, aQp, xb2p, sp, ctr, nth)
        add_bias(xb2, obias[l])
        add_block(x, xb2, post_norm[l, 0], eps)
        # -- feed-forward: norm, (MoE: router, routing,) per expert (one for a dense FFN): gate and up
        # with the GLU (one parallel region), down, its weighted output added; (post-norm), add
        rmsnorm1(x, ffn_norm[l], eps, xa)
        quantize_needed(need[l, 2], aE)
        if n_used:
            product(runs, w[7], bp, pp, aEp, addr_of(rlog), sp, ctr, nth)
            add_bias(rlog, rbias[l])
            moe_route(rlog, n_used, norm_w, weight_softmax, sel, selw)
        for i in range(E):
            xb2[i] = 0.0
        for j in range(max(n_used, 1) + has_shexp):
            shx = n_used != 0 and j == n_used      # the shared expert, after the routed ones
            e = sel[j] if n_used and not shx else 0
            m0 = 8 if shx else 4
            af = aS if shx else aF
            afp = aSp if shx else aFp
            ha = af[0][0]                          # act(gate) * up, float32 (n_ff,)
            for r in range(3):
                for col in range(WT_COLS):
                    mrow[r, col] = w[m0 + r, col]
                mrow[r, 0] += e * w[m0 + r, 5]
            mg, mu, md = mrow[0], mrow[1], mrow[2]
            ctr[CTR] = 0
            for _ in prange(nth):
                c = fetch_add(ctr, CTR, 1)
                while c < nchunks(mg):  # gate and up have the same rows, so the same chunks
                    rows(runs, mg, c, bp, pp, aEp, hgp, o_0, sp)
                    rows(runs, mu, c, bp, pp, aEp, hup, o_0, sp)
                    r0 = c * mg[4]
                    r1 = min(r0 + mg[4], mg[2])
                    if has_eb and not shx:   # the expert's gate and up biases (ggml_add_id)
                        for i in range(r0, r1):
                            hg[i] += gbias[l, e, i]
                            hu[i] += ubias[l, e, i]
                    glu(hg[r0:r1], hu[r0:r1], ha[r0:r1], glu_kind, gelu_tab)
                    c = fetch_add(ctr, CTR, 1)
            quantize_needed(need[l, 3], af)
            product(runs, md, bp, pp, afp, yep, sp, ctr, nth)
            if has_eb and not shx:
                add_bias(ye, dbias[l, e])
            we = selw[j] if n_used and not shx else np.float32(1.0)
            if shx:   # sigmoid(h . ffn_gate_inp_shexp)
                gs = np.float32(0.0)
                for i in range(E):
                    gs += xa[i] * shg[l, i]
                we = np.float32(1.0) / (np.float32(1.0) + expf(-gs))
            for i in range(E):
                xb2[i] += ye[i] * we
        add_block(x, xb2, post_norm[l, 1], eps)
    if want:
        rmsnorm1(x, out_norm, eps, xa)
        quantize_needed(need[n_layer, 0], aE)
        product(runs, ot, bp, pp, aEp, addr_of(logits), sp, ctr, nth)


# -- building it for a model ------------------------------------------------------------------------

def _copy_weights(nbytes: int) -> bool:
    """Whether the decode step gets its own huge-page copy of ``nbytes`` of weights (module doc)."""
    if not config.copy_weights():
        return False
    try:
        with open("/proc/meminfo") as fh:
            avail = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return nbytes <= RAM_COPY_FRACTION * avail


def _huge_empty(n: int) -> np.ndarray:
    """n bytes (zeros) of a fresh anonymous mapping, 2 MiB-aligned, advised MADV_HUGEPAGE (where the
    OS has it); the returned array keeps the mapping alive."""
    align = 2 << 20
    mm = mmap.mmap(-1, n + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared would be shmem
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    whole = np.frombuffer(mm, np.uint8)
    start = (-whole.ctypes.data) % align
    return whole[start:start + n]


def _huge_copy(src: np.ndarray) -> np.ndarray:
    """``src``'s bytes in a ``_huge_empty`` buffer."""
    out = _huge_empty(src.nbytes)
    out[:] = src
    return out


def use_x8(variant: str) -> bool:
    """Whether the decode step reads the x8 types' matrices from an 8-row interleaved copy: the vnni and
    avx2 and neon variants (ir_x8.x8_flavour), unless ``QUANTKIT_X8=0``."""
    return bool(x8_types(variant)) and config.x8()


def _flat_buffer(model: Llama, weights: list[Weight]) -> tuple[np.ndarray, list[int], bool]:
    """One uint8 buffer holding every matrix, each matrix's byte offset in it, and whether the buffer
    is a copy: when all of them lie inside the file's memory map (always, for a GGUF opened from
    disk), the map itself or, opted in (``_copy_weights``), a huge-page copy of the span holding them;
    else a concatenated copy."""
    base = getattr(getattr(model.gguf, "reader", None), "data", None)
    if isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 1:
        flat = base.view(np.ndarray)
        b0 = flat.__array_interface__["data"][0]
        offs = [w.data.__array_interface__["data"][0] - b0 for w in weights]
        if all(0 <= o and o + w.data.nbytes <= flat.size and w.data.flags.c_contiguous
               for o, w in zip(offs, weights)):
            lo = min(offs)
            hi = max(o + w.data.nbytes for o, w in zip(offs, weights))
            if _copy_weights(hi - lo):
                return frozen(_huge_copy(flat[lo:hi])), [o - lo for o in offs], True
            return frozen(flat), offs, False
    parts = [np.ascontiguousarray(w.data).reshape(-1) for w in weights]
    offs = list(np.cumsum([0] + [p.size for p in parts[:-1]]))
    return frozen(np.concatenate(parts)), [int(o) for o in offs], True


def step_kernel(kv_f16: bool):
    """The compiled step for a KV cache kind (fp16 bits or float32): one build for every model."""
    ld, st = (kv_f16_load, kv_f16_store) if kv_f16 else (kv_f32_same, kv_f32_same)
    return build(step_body, "kv16" if kv_f16 else "kv32", True, ST_KV=st, ATTEND=attend_kernel(kv_f16))


class DecodeStep:
    """The flat tables and buffers of one model for ``step_body``; ``run(runner, tok, pos, logits)``."""

    def __init__(self, model: Llama, kv_f16: bool, variant: str | None = None):
        variant = variant or default_variant()
        if variant == "plain":
            raise ModelError("the compiled decode step needs the integer kernels (not QUANTKIT_KERNELS=plain)")
        c = model.config
        # the step interprets the layers' records (quantkit.model.layer) through ``dims`` and its
        # per-layer tables: one set of attention flags for all layers, a dense GLU FFN in each
        kinds = {(d.attn.rope_neox, d.attn.qk_norm, d.attn.post_norm, d.ffn.glu,
                  isinstance(d.ffn, DenseFFN) and d.ffn.post_norm,
                  (d.ffn.n_expert, d.ffn.n_expert_used, d.ffn.n_ff, d.ffn.norm_w, d.ffn.n_ff_shexp, d.ffn.gating,
                   d.ffn.biases)
                  if isinstance(d.ffn, MoeFFN) else None)
                 for d in model.layers}
        if len(kinds) != 1:
            raise ModelError("the compiled decode step needs the same attention and FFN kind in every layer")
        (neox, qk_norm, post_attn, glu_name, post_ffw, moe), = kinds
        if post_attn != post_ffw:
            raise ModelError("the compiled decode step needs both post-norms or neither")
        f = model.layers[0].ffn
        if isinstance(f, MoeFFN) and f.w_scale not in (0.0, 1.0):
            raise ModelError("the compiled decode step routes experts without a weight scale only")
        n_shexp = moe[4] if moe else 0
        names = MOE_MATS + (SHEXP_MATS if n_shexp else ()) if moe else MATS
        per_layer = [[getattr(b, name) for name in names] for b in model.blk]
        mats = [w for ws in per_layer for w in ws]
        weights = mats + [model.output, model.token_embd]
        types = tuple(sorted({w.type for w in weights}, key=int))
        # the products of an x8 type with whole 8-row groups read an interleaved copy (not the embedding,
        # which is looked up by row from the map)
        # and the float matrices read the step's own copy of their rows (``copies_rows``), unless the
        # whole span is copied already (QUANTKIT_COPY_WEIGHTS=1)
        xt = set(x8_types(variant)) if use_x8(variant) else set()
        ct = {t for t in types if copies_rows(t)} if not config.copy_weights() else set()
        packed = [w.type in ct or (w.type in xt and (w.data.shape[0] // w.n_expert) % X8_ROWS == 0)
                  for w in weights[:-1]] + [False]

        def slot_set(packed):
            return tuple(sorted({(w.type, p) for w, p in zip(weights, packed)}, key=lambda k: (int(k[0]), k[1])))

        slots = slot_set(packed)
        # over the slot count: a type that needs both layouts (e.g. the embedding's type, also a packed
        # layer matrix's) reads the file's rows for all its matrices, fewest packed bytes first; with
        # every such type done there is one slot per type
        twice = [t for t, p in slots if p and (t, False) in slots]
        for t in sorted(twice, key=lambda t: sum(w.data.nbytes for w, p in zip(weights, packed) if p and w.type == t)):
            if len(slots) <= SLOTS:
                break
            packed = [p and w.type != t for w, p in zip(weights, packed)]
            slots = slot_set(packed)
        if len(slots) > SLOTS:
            raise ModelError(f"{len(types)} distinct matrix types; the compiled step handles {SLOTS}")
        self.types, self.slots = types, slots
        buf, offs, copied = _flat_buffer(model, weights)
        self.buf = buf
        #: whether ``buf`` is a copy (not the file's map); ``views`` maps each matrix's name to its bytes
        #: in ``buf``, shaped as its ``data``, so the batch path can read the same copy
        self.copied = copied
        self.views = {w.name: buf[o:o + w.data.nbytes].reshape(w.data.shape) for w, o in zip(weights, offs)}
        code = {k: i for i, k in enumerate(slots)}
        # x8 copies: offsets in ``pbuf`` (64-byte aligned); made at the first ``run`` (``make_x8``), so
        # a Runner used only for batches (perplexity, imatrix) never holds them
        self._model, self._x8_todo, self.x8_bytes = model, [], 0
        self.pbuf = np.zeros(64, np.uint8)
        for w, p in zip(weights, packed):
            if p:
                self._x8_todo.append((w, self.x8_bytes))
                self.x8_bytes += -(-w.data.nbytes // 64) * 64

        def row(w: Weight, off: int, p: bool, po: int):
            # a 3D expert tensor: the rows of one expert, the others a stride apart (the same in both layouts)
            n = w.data.shape[0] // w.n_expert
            stride = n * w.data.shape[1]
            if p:  # an x8 row group's bytes, or a copied row's
                return [po, w.data.shape[1] * (1 if w.type in ct else X8_ROWS), n, code[w.type, True], chunk_rows(n),
                        stride]
            return [off, w.data.shape[1], n, code[w.type, False], chunk_rows(n), stride]

        pos = iter(o for _, o in self._x8_todo)
        tab = np.array([row(w, o, p, next(pos) if p else 0) for w, o, p in zip(weights, offs, packed)], np.int64)
        wt = tab[:len(mats)].reshape(c.n_layer, len(names), WT_COLS)
        if not moe:  # a dense layer's eighth entry: empty (never read)
            wt = np.concatenate([wt, np.zeros((c.n_layer, 1, WT_COLS), np.int64)], axis=1)
        self.wt = np.ascontiguousarray(wt)
        self.ot = np.ascontiguousarray(tab[len(mats)])
        self.et = np.ascontiguousarray(tab[len(mats) + 1])

        def bits(*ws: Weight) -> int:
            return int(np.bitwise_or.reduce([KIND_BIT[activation_kind(w.type, variant)] for w in ws]))

        need = np.zeros((c.n_layer + 1, 4), np.int64)
        for i, ws in enumerate(per_layer):
            # attention's input; attn_output's; the FFN's (and the router's, the shared expert's gate / up);
            # ffn_down's (and the shared expert's)
            need[i] = (bits(*ws[:3]), bits(ws[3]), bits(*ws[4:6], *ws[7:10]), bits(ws[6], *ws[10:]))
        need[c.n_layer, 0] = bits(model.output)
        self.need = need
        self.attn_norm = np.ascontiguousarray(np.stack([b.attn_norm for b in model.blk]), np.float32)
        self.ffn_norm = np.ascontiguousarray(np.stack([b.ffn_norm for b in model.blk]), np.float32)
        self.out_norm = np.ascontiguousarray(model.output_norm, np.float32)
        self.aE = _activations(c.n_embd)
        self.aQ = _activations(c.n_embd_q)
        n_ff = moe[2] if moe else c.n_ff
        self.aF = _activations(n_ff)
        self.x = np.zeros(c.n_embd, np.float32)
        self.xb2 = np.zeros(c.n_embd, np.float32)
        self.qkv = np.zeros(c.n_embd_q + 2 * c.n_embd_kv, np.float32)
        self.hg = np.zeros(max(n_ff, n_shexp), np.float32)
        self.hu = np.zeros(max(n_ff, n_shexp), np.float32)
        k = moe[1] if moe else 1
        shg = np.ascontiguousarray(np.stack([b.ffn_gate_inp_shexp.dequantize().reshape(-1) for b in model.blk]),
                                   np.float32) if n_shexp else np.zeros((c.n_layer, 0), np.float32)
        eb = bool(moe and moe[6])

        def per_layer_f32(name: str, shape: tuple) -> np.ndarray:
            if not eb:
                return np.zeros((c.n_layer,) + (0,) * len(shape), np.float32)
            return np.ascontiguousarray(np.stack([getattr(b, name) for b in model.blk]), np.float32)

        self.moe = (np.zeros(moe[0] if moe else 1, np.float32), np.zeros(c.n_embd, np.float32), np.zeros(k, np.float32),
                    np.zeros(k, np.int64), np.zeros((3, WT_COLS), np.int64), shg, _activations(n_shexp or 32),
                    per_layer_f32("ffn_gate_inp_bias", (1,)), per_layer_f32("ffn_gate_exps_bias", (1, 1)),
                    per_layer_f32("ffn_up_exps_bias", (1, 1)), per_layer_f32("ffn_down_exps_bias", (1, 1)))
        blk = model.blk
        self.attn_x = (np.ascontiguousarray(np.stack([b.attn_sinks for b in blk]), np.float32)
                       if blk[0].attn_sinks is not None else np.zeros((c.n_layer, 0), np.float32),
                       np.ascontiguousarray(np.stack([b.attn_output_bias for b in blk]), np.float32)
                       if blk[0].attn_output_bias is not None else np.zeros((c.n_layer, 0), np.float32))
        self.sc = np.zeros(SC_LEN, np.int32)
        self.ctr = np.zeros(2 * CTR, np.int64)
        self.dims = np.array([c.n_head, c.n_head_kv, c.head_dim, c.n_rot, neox, GLU_KINDS.index(glu_name),
                              qk_norm, post_attn, moe[1] if moe else 0, moe[3] if moe else 0, n_shexp,
                              int(bool(moe) and moe[5] == "softmax_weight")], np.int64)
        self.eps = np.float32(c.rms_eps)
        self.scale = np.float32(c.kq_scale)
        self.bias = layer_biases(model)
        self.qk_norm = _stack(model, ("attn_q_norm", "attn_k_norm"), c.head_dim)
        self.post_norm = _stack(model, ("post_attention_norm", "post_ffw_norm"), c.n_embd)
        self.gelu_tab = gelu_table() if glu_name == "gelu" else np.zeros(1, np.float32)
        self.embd_scale = np.float32(c.embd_scale)
        # the slot table: each slot's row runner (unused slots repeat slot 0) and embedding lookup
        pad = list(slots) + [slots[0]] * (SLOTS - len(slots))
        # (the runners' addresses: int64 arrays, which numba types in no time, where a tuple of the
        # runners themselves took ~140 us a token to type; ``runners`` keeps their code alive)
        self.runners = [(row_runner(t, x8, variant), deq_runner(t)) for t, x8 in pad]
        self.runs = np.array([r.address for r, _ in self.runners], np.int64)
        self.deqs = np.array([d.address for _, d in self.runners], np.int64)
        self.atab = np.stack([act_table(a) for a in (self.aE, self.aQ, self.aF, self.moe[6])])
        self.fn = step_kernel(kv_f16)

    def make_x8(self) -> None:
        """Fill ``pbuf`` with the x8 layout of the matrices that use it and the copied rows of the float
        ones (the first ``run`` does, once),
        ``X8_SLICE_BYTES`` of rows at a time, dropping each slice's file pages from this process as soon
        as it is packed (the batch path reads them back from the map when it runs): the interleaved
        copy replaces the map for decoding, so the resident weight bytes stay one copy, plus one slice
        while packing."""
        if not self._x8_todo:
            return
        m = self._model
        pbuf = _huge_empty(self.x8_bytes)
        done = []
        for w, o in self._x8_todo:
            # also when the output is tied to the embedding: the lookup faults back one row per token
            src = m.gguf.tensor(w.name) if not self.copied and m.gguf.has_tensor(w.name) else None
            n, rb = w.data.shape
            step = max(X8_ROWS, X8_SLICE_BYTES // rb // X8_ROWS * X8_ROWS)
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                if copies_rows(w.type):
                    pbuf[o + r0 * rb:o + r1 * rb] = w.data[r0:r1].reshape(-1)
                else:
                    pack_x8(w.data[r0:r1], w.type, pbuf[o + r0 * rb:o + r1 * rb])
                if src is not None:
                    m.gguf.release(src, r0, r1)
            if src is not None:
                done.append(src)
        # the page faults of later slices also map their neighbours (the kernel's fault-around, up to
        # 64 KiB): once more over every packed matrix
        for src in done:
            m.gguf.release(src)
        self.pbuf, self._x8_todo = pbuf, []

    def run(self, tok: int, pos: int, kc, vc, cos, sin, lay, scores, logits, want: bool) -> None:
        """``cos`` / ``sin`` (n_tables, n_ctx, n_rot/2), ``lay`` (n_layer, 2): as ``step_body``'s."""
        if self._x8_todo:
            self.make_x8()
        self.fn(tok, pos, want, self.runs, self.deqs, self.buf, self.pbuf, self.wt, self.ot, self.et, self.attn_norm, self.ffn_norm,
                self.out_norm, cos, sin, kc, vc, self.need, self.aE, self.aQ, self.aF, self.x, self.xb2, self.qkv,
                self.hg, self.hu, scores, logits, self.sc, self.ctr, get_threads(), self.dims, self.eps, self.scale,
                lay, self.bias, self.qk_norm, self.post_norm, self.gelu_tab, self.embd_scale, self.moe, self.attn_x,
                self.atab)


def layer_biases(model: Llama) -> np.ndarray:
    """float32 (n_layer, Q + 2 KV): each layer's Q, K, V biases (zeros for one the layer lacks), or
    (n_layer, 0) when no layer has any."""
    c = model.config
    parts = ((c.n_embd_q, "attn_q_bias"), (c.n_embd_kv, "attn_k_bias"), (c.n_embd_kv, "attn_v_bias"))
    if not any(getattr(b, name) is not None for b in model.blk for _, name in parts):
        return np.zeros((c.n_layer, 0), np.float32)
    return np.ascontiguousarray(np.stack([np.concatenate(
        [np.zeros(n, np.float32) if getattr(b, name) is None else getattr(b, name) for n, name in parts])
        for b in model.blk]), np.float32)


def _stack(model: Llama, names: tuple[str, str], n: int) -> np.ndarray:
    """float32 (n_layer, 2, n) of two per-layer norm weights, or (n_layer, 2, 0) when the arch has none."""
    blk = model.blk
    if getattr(blk[0], names[0]) is None:
        return np.zeros((len(blk), 2, 0), np.float32)
    return np.ascontiguousarray(np.stack([[getattr(b, names[0]), getattr(b, names[1])] for b in blk]), np.float32)


def _activations(n: int) -> tuple:
    """Every activation form of one input vector of n elements (see ``urow_q8_0``), each (1, ...)."""
    nb32, nbk = n // 32, n // 256
    return (np.zeros((1, n), np.float32), np.zeros((1, n), np.int8), np.zeros((1, nb32), np.float32),
            np.zeros((1, nb32), np.int32), np.zeros((1, nb32), np.float32), np.zeros((1, n), np.int8),
            np.zeros((1, nbk), np.float32), np.zeros((1, n // 16), np.int32), np.zeros((1, n), np.float32),
            np.zeros((1, n), np.float32))


__all__ = ["attend_kernel", "exp_shift_sum", "expf", "gelu_table", "glu", "kv_f16_store", "kv_f32_same",
           "max_f32", "qk_prepare", "rmsnorm1", "window_start", "DecodeStep", "MATS", "MOE_MATS", "SHEXP_MATS", "SLOTS",
           "step_kernel"]
