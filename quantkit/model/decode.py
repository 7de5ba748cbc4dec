"""The decode step in compiled code: one numba call per generated token runs every layer.

``DecodeStep(model, kv_f16)`` turns a ``Llama`` into flat tables and records once, and ``run(...)``
runs one token: the embedding row, then each layer's program (``quantkit.model.layer``: per block its
input norm, its op, its output norm and the residual add) -- ``attn_op``: activation quantization
(once per distinct input and activation kind), Q/K/V products, ``qk_prepare`` (biases, Q/K norms,
RoPE), KV store, attention over the cache (or its sliding window), output product; ``mla_op``: multi-head
latent attention in its absorbed form (the latent and k_pe stored, per-head attn_k_b / attn_v_b products
around one-KV-head attention over them); ``ffn_op``: gate /
up products with the GLU, down product, or in a mixture-of-experts layer the router product,
``route.route_token`` and those three products for each chosen expert alone, their weighted outputs
added in selection order, then a shared expert --; then the final norm and the logits product. Layers
may differ (a dense first layer before MoE layers). No Python runs between layers (docs/kernels.md:
per-layer Python work over 30 layers costs more than the products of a small model).

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
  rows, expert stride)`` for the matrices of a layer in its named slots ``W_Q`` .. ``W_V_B``
  (``MATS`` in a dense layer, ``MOE_MATS`` and ``SHEXP_MATS`` in a MoE layer, ``MLA_MATS`` for MLA: a 3D
  expert -- or per-head -- tensor is one entry of one expert's rows, expert e at offset + e * stride;
  unused slots are empty); ``ot`` / ``et``
  the same for ``output`` and ``token_embd``.
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
from collections import namedtuple

import numpy as np

from quantkit import config
from quantkit.errors import ModelError

from quantkit.jit import addr_of, call_addr, fetch_add, frozen, get_threads, njit_fast, njit_fast_parallel, prange
from quantkit.kernels import activation_kind, default_variant, quantize_q8_01_into, quantize_q8_k_into
from quantkit.kernels.activations import round_bf16_into, round_f16_into
from quantkit.kernels.runners import SC_LEN, act_table, copies_rows, deq_runner, row_runner
from quantkit.kernels.vecdot import X8_ROWS, build, pack_x8, x8_types
from quantkit.model.arch import GLU_KINDS
from quantkit.model.layer import MLA, Attn, DeltaNet, DenseFFN, MoeFFN, ShortConv
from quantkit.model.llama import Llama, Weight
# the ops the step calls; exp_shift_sum, expf, gelu_table, max_f32 are re-exported (the batch path, perplexity)
from quantkit.model.ops import NO_SINK, add_bias, attn_temperature, delta_net, qk_finish, shortconv
from quantkit.model.route import ROUTING_DTYPE, route_token, routing_record
from quantkit.model.ops import (add_block, attend_kernel, exp_shift_sum, expf, gelu_table, glu, kv_f16_load,  # noqa: F401
                                kv_f16_store, kv_f32_same, max_f32, mla_prepare, qk_prepare, rmsnorm1, window_start)

#: the matrices of a layer in the slots of ``wt[layer]``, named W_Q .. W_DOWN_SH: a dense layer's seven
MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, W_ROUTER, W_GATE_SH, W_UP_SH, W_DOWN_SH, W_K_B, W_V_B = range(13)
N_MATS = 13
#: a MoE layer's: the experts' 3D tensors in the FFN's places, and the router
MOE_MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
            "ffn_gate_inp")
#: after them, a shared expert's (qwen2moe)
SHEXP_MATS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
#: an MLA layer's (quantkit.model.layer.MLA) in the attention's slots W_Q .. W_O -- q (attn_q, or attn_q_b
#: after its low rank), the latent's attn_kv_a_mqa, attn_q_a (empty without q_lora_rank), attn_output --
#: and its per-head attn_k_b / attn_v_b (3D: one head's rows, the next a stride on) in W_K_B / W_V_B
MLA_MATS = {W_K: "attn_kv_a_mqa", W_V: "attn_q_a", W_O: "attn_output", W_K_B: "attn_k_b", W_V_B: "attn_v_b"}
#: a short-convolution layer's (quantkit.model.layer.ShortConv) in the attention's input and output slots
SHORTCONV_MATS = {W_Q: "shortconv_in_proj", W_O: "shortconv_out_proj"}
#: a gated DeltaNet layer's (quantkit.model.layer.DeltaNet): its three input products, then ssm_out
DELTANET_MATS = {W_Q: "attn_qkv", W_K: "attn_gate", W_V: "ssm_ba", W_O: "ssm_out"}
#: every matrix name a layer's slots may hold (ffn_gate_up_exps: the experts' gate and up merged, read as
#: W_GATE's and W_UP's rows of each expert)
STEP_MATS = tuple(dict.fromkeys(MATS + MOE_MATS + SHEXP_MATS + tuple(MLA_MATS.values()) +
                                tuple(SHORTCONV_MATS.values()) + tuple(DELTANET_MATS.values()) +
                                ("attn_q_b", "ffn_gate_up_exps")))
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


@njit_fast_parallel
def per_head(runs, m, mh, n_head, bp, pp, atabs, op, o_step, sp, ctr, nth):
    """out[h * o_step + r] = row r of head h's matrix . head h's activations (table ``atabs[h]``) for every
    head of a 3D per-head tensor (``m``: head 0's ``wt`` row, head h a stride on; ``mh`` scratch (>= n_head,
    WT_COLS)): one parallel region whose threads claim (head, chunk) pairs, not a region per head."""
    for h in range(n_head):
        for col in range(WT_COLS):
            mh[h, col] = m[col]
        mh[h, 0] += h * m[5]
    nch = nchunks(m)
    ctr[CTR] = 0
    for _ in prange(nth):
        c = fetch_add(ctr, CTR, 1)
        while c < n_head * nch:
            h = c // nch
            rows(runs, mh[h], c - h * nch, bp, pp, addr_of(atabs[h]), op, h * o_step, sp)
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

# -- the step: the layer program (quantkit.model.layer) as records the compiled code walks ---------
#
# Per layer, up to MAX_BLOCKS ``BLOCK_DTYPE`` records (``prog[l]``): the op, the row of ``norms[l]`` of
# its input norm and of its output norm (-1: none); per layer the op's parameters as named records
# (``attn[l]``: ATTN_DTYPE, ``ffn[l]``: FFN_DTYPE, ``routing[l]``: quantkit.model.route.ROUTING_DTYPE)
# and its tensors in named tables (``AttnTables``, ``MoeTables``). Layers may differ in every one of
# them: a dense first layer before MoE layers, sliding and global attention.

#: ops of ``BLOCK_DTYPE.op`` (0: no block)
OP_NONE, OP_ATTN, OP_DENSE, OP_MOE, OP_MLA, OP_SHORTCONV, OP_DELTANET = 0, 1, 2, 3, 4, 5, 6
OP_CODES = {Attn: OP_ATTN, DenseFFN: OP_DENSE, MoeFFN: OP_MOE, MLA: OP_MLA, ShortConv: OP_SHORTCONV,
            DeltaNet: OP_DELTANET}
MAX_BLOCKS = 2
BLOCK_DTYPE = np.dtype([("op", np.int64), ("norm", np.int64), ("post", np.int64), ("scale", np.float32)])
ATTN_DTYPE = np.dtype([("rope_table", np.int64), ("n_swa", np.int64), ("neox", np.int64), ("qk_norm", np.int64),
                       ("qkv_bias", np.int64), ("sinks", np.int64), ("out_bias", np.int64), ("rope", np.int64),
                       ("qk_full", np.int64), ("softcap", np.float32), ("l2", np.int64), ("temp_floor", np.int64),
                       ("temp_scale", np.float32), ("temp_offset", np.float32), ("gate", np.int64)])
FFN_DTYPE = np.dtype([("glu", np.int64), ("n_ff", np.int64), ("n_ff_shexp", np.int64), ("shexp_gate", np.int64),
                      ("biases", np.int64), ("w_before", np.int64)])
#: (ATTN_DTYPE's n_swa is ``Attn.window``: negative for chunks; l2 / temp_*: Llama 4's L2 q/k norm and NoPE
#: temperature, ``ops.qk_finish``; FFN_DTYPE's w_before: ``MoeFFN.weight_before``)
MLA_DTYPE = np.dtype([(name, np.int64) for name in ("rope_table", "neox", "n_head", "n_lora_q", "n_lora_kv", "n_nope",
                                                     "n_rot", "n_v")])

#: the step's tables, each a namedtuple numba reads by field name
Weights = namedtuple("Weights", "runs deqs buf pbuf wt ot et sc ctr")
Acts = namedtuple("Acts", "aE aQ aF aX aS aL aN aV atab atab_n atab_v")
Scratch = namedtuple("Scratch", "x xb2 qkv hg hu ye rlog rsc sel selw mrow mla mhead hs rec")
Program = namedtuple("Program", "prog norms attn mla ffn routing need out_norm gelu_tab")
AttnTables = namedtuple("AttnTables", "bias qk_norm sinks out_bias q_a_norm kv_a_norm")
MoeTables = namedtuple("MoeTables", "shexp_inp router_bias score_bias gate_bias up_bias down_bias")
#: the recurrent ops' per-layer tensors (quantkit.model.layer, "Recurrent ops"): ShortConv's taps (n_layer,
#: n_embd, l_cache); DeltaNet's ssm_conv1d (n_layer, conv_dim, d_conv), ssm_dt.bias and ssm_a (n_layer,
#: n_v_heads), ssm_norm (n_layer, head_dim) and its key heads (``dn_k``, one int); their state is the step's
#: ``rs`` (n_layer, widest state_size), Runner.state itself
RecTables = namedtuple("RecTables", "conv dn_conv dn_dt dn_a dn_norm dn_k")
Dims = namedtuple("Dims", "n_head n_head_kv head_dim n_rot eps scale embd_scale")
#: rows of ``Acts.atab``: the activation tables of aE, aQ (the attention's output), aF (dense FFN), aX (an
#: expert), aS (the shared expert), and MLA's inputs of attn_q_b (aL), of attn_k_b (aN: every head's q_nope,
#: a row each) and of attn_v_b (aV: every head's latent output); ``Acts.atab_n`` / ``atab_v``: per head, the
#: table of its row of aN / aV
A_E, A_Q, A_F, A_X, A_S, A_L, A_N, A_V = range(8)
#: columns of ``Program.need``: the activation kinds (KIND_BIT) each input's products need -- the block's
#: input, the attention's output, the FFN's input, ffn_down's input, and MLA's aL, aN, aV
N_NEED = 7


def attn_op(l, pos, W, A, S, P, T, D, kc, vc, cos, sin, scores, nth):
    """Layer l's attention (``quantkit.model.layer.Attn``) of the normed input in A.aE at position
    ``pos`` into S.xb2: Q/K/V (one parallel region), biases + q/k norms + RoPE (``qk_prepare``), the cache
    store, attention over the cache (or its window; a prange over heads), the output product (+ bias)."""
    a = P.attn[l]
    w = W.wt[l]
    n_head, hd = D.n_head, D.head_dim
    Q = n_head * hd
    KV = D.n_head_kv * hd
    gated = a.gate != 0
    Qw = 2 * Q if gated else Q     # attn_q's rows: with the output gate, per head [query, gate]
    group = n_head // D.n_head_kv
    n_kv = pos + 1
    nob = T.bias[0, :0]
    o_0 = np.int64(0)
    qkv = S.qkv
    bp, pp, sp = addr_of(W.buf), addr_of(W.pbuf), addr_of(W.sc)
    aEp, qkvp = addr_of(A.atab[A_E]), addr_of(qkv)
    quantize_needed(P.need[l, 0], A.aE)
    cq, ck, cv = nchunks(w[W_Q]), nchunks(w[W_K]), nchunks(w[W_V])
    # a prange body reads locals only: a namedtuple's field or a record read inside one was miscompiled
    # (numba 0.6x: the expert biases' in-place adds were lost; a record argument does not compile)
    ctr, runs, mq, mk, mv = W.ctr, W.runs, w[W_Q], w[W_K], w[W_V]
    ctr[CTR] = 0
    for _ in prange(nth):
        c = fetch_add(ctr, CTR, 1)
        while c < cq + ck + cv:
            if c < cq:
                rows(runs, mq, c, bp, pp, aEp, qkvp, o_0, sp)
            elif c < cq + ck:
                rows(runs, mk, c - cq, bp, pp, aEp, qkvp, Qw, sp)
            else:
                rows(runs, mv, c - cq - ck, bp, pp, aEp, qkvp, Qw + KV, sp)
            c = fetch_add(ctr, CTR, 1)
    gt = S.rec
    if gated:       # the gates aside, the queries packed to the front (each head's moves down: no overlap)
        for h in range(n_head):
            for i in range(hd):
                gt[h * hd + i] = qkv[2 * h * hd + hd + i]
            for i in range(hd):
                qkv[h * hd + i] = qkv[2 * h * hd + i]
    bl = T.bias[l]
    has_b = a.qkv_bias != 0
    q, k, v = qkv[:Q], qkv[Qw:Qw + KV], qkv[Qw + KV:Qw + 2 * KV]
    # the Q norm's weights, then the K norm's: each head_dim long, or the whole projection's (qk_full)
    full = a.qk_full != 0
    nq = Q if full else hd
    nk = KV if full else hd
    qn = T.qk_norm[l, :nq] if a.qk_norm != 0 else nob
    kn = T.qk_norm[l, nq:nq + nk] if a.qk_norm != 0 else nob
    qk_prepare(q, k, v, bl[:Q] if has_b else nob, bl[Q:Q + KV] if has_b else nob, bl[Q + KV:] if has_b else nob,
               qn, kn, full, D.eps, n_head, D.n_head_kv, hd, D.n_rot if a.rope != 0 else 0, cos[a.rope_table, pos],
               sin[a.rope_table, pos], a.neox != 0)
    qk_finish(q, k, n_head, D.n_head_kv, hd, a.l2 != 0, D.eps, attn_temperature(pos, a.temp_floor, a.temp_scale,
                                                                                a.temp_offset))
    krow = kc[l, pos]
    vrow = vc[l, pos]
    for i in range(KV):
        krow[i] = ST_KV(k[i])  # noqa: F821
        vrow[i] = ST_KV(v[i])  # noqa: F821
    kl = kc[l]
    vl = vc[l]
    k0 = window_start(n_kv, a.n_swa)
    xo = A.aQ[0][0]         # the attention output, float32 (Q,)
    has_sinks, sinks, scale, cap = a.sinks != 0, T.sinks[l], D.scale, a.softcap
    for h in prange(n_head):
        snk = sinks[h] if has_sinks else np.float32(NO_SINK)
        ko = (h // group) * hd
        ATTEND(qkv[h * hd:(h + 1) * hd], kl, vl, ko, ko, k0, n_kv, scale, cap, snk, scores[h],  # noqa: F821
               xo[h * hd:(h + 1) * hd])
    if gated:       # qwen3next's build_layer_attn: times sigmoid(gate) before attn_output
        for i in range(Q):
            xo[i] *= np.float32(1.0) / (np.float32(1.0) + np.exp(-gt[i]))
    quantize_needed(P.need[l, 1], A.aQ)
    product(W.runs, w[W_O], bp, pp, addr_of(A.atab[A_Q]), addr_of(S.xb2), sp, ctr, nth)
    if a.out_bias != 0:
        add_bias(S.xb2, T.out_bias[l])


def mla_op(l, pos, W, A, S, P, T, D, kc, cos, sin, scores, nth):
    """Layer l's multi-head latent attention (``quantkit.model.layer.MLA``) of the normed input in A.aE
    at position ``pos`` into S.xb2, absorbed as llama.cpp runs it: q (attn_q; or attn_q_a, its norm, attn_q_b)
    and the latent (attn_kv_a_mqa) in one parallel region, ``mla_prepare`` (RoPE, the latent's norm), the
    cache store of the latent and k_pe, per head q_nope @ attn_k_b[h] beside q_pe, attention of every head
    over the cached rows (a prange over heads; values: the rows' latent), per head the latent output @
    attn_v_b[h], the output product. ``S.mla`` holds q, kv, q_a, the absorbed queries, the latent outputs."""
    a = P.mla[l]
    w = W.wt[l]
    H, LQ, L, nope, R, nv = a.n_head, a.n_lora_q, a.n_lora_kv, a.n_nope, a.n_rot, a.n_v
    hk = nope + R
    KW = L + R
    Q = H * hk
    o_kv, o_qa = Q, Q + KW
    o_abs = o_qa + LQ
    o_lat = o_abs + H * KW
    m = S.mla
    q, kv, qa, qabs, lat = m[:Q], m[o_kv:o_qa], m[o_qa:o_abs], m[o_abs:o_lat], m[o_lat:o_lat + H * L]
    bp, pp, sp = addr_of(W.buf), addr_of(W.pbuf), addr_of(W.sc)
    aEp, mp = addr_of(A.atab[A_E]), addr_of(m)
    quantize_needed(P.need[l, 0], A.aE)
    # (locals only in a prange body: attn_op)
    ctr, runs, mk = W.ctr, W.runs, w[W_K]
    m1 = w[W_V] if LQ > 0 else w[W_Q]       # q_a or q, beside the latent
    o1 = o_qa if LQ > 0 else 0
    c1, ck = nchunks(m1), nchunks(mk)
    ctr[CTR] = 0
    for _ in prange(nth):
        c = fetch_add(ctr, CTR, 1)
        while c < c1 + ck:
            if c < c1:
                rows(runs, m1, c, bp, pp, aEp, mp, o1, sp)
            else:
                rows(runs, mk, c - c1, bp, pp, aEp, mp, o_kv, sp)
            c = fetch_add(ctr, CTR, 1)
    if LQ > 0:
        rmsnorm1(qa, T.q_a_norm[l], D.eps, A.aL[0][0])
        quantize_needed(P.need[l, 4], A.aL)
        product(runs, w[W_Q], bp, pp, addr_of(A.atab[A_L]), mp, sp, ctr, nth)
    mla_prepare(q, kv, T.kv_a_norm[l], D.eps, H, nope, R, cos[a.rope_table, pos], sin[a.rope_table, pos], a.neox != 0)
    krow = kc[l, pos]
    for i in range(KW):
        krow[i] = ST_KV(kv[i])  # noqa: F821
    # per head: [attn_k_b[h] @ q_nope, q_pe], the query against the cache rows [latent, k_pe]
    xn = A.aN[0]
    for h in range(H):
        for i in range(nope):
            xn[h, i] = q[h * hk + i]
        for i in range(R):
            qabs[h * KW + L + i] = q[h * hk + nope + i]
    quantize_needed(P.need[l, 5], A.aN)
    per_head(runs, w[W_K_B], S.mhead, H, bp, pp, A.atab_n, addr_of(qabs), KW, sp, ctr, nth)
    kl = kc[l]
    n_kv = pos + 1
    scale = D.scale
    for h in prange(H):
        ATTEND(qabs[h * KW:(h + 1) * KW], kl, kl, 0, 0, 0, n_kv, scale, np.float32(0.0), np.float32(NO_SINK),  # noqa: F821
               scores[h], lat[h * L:(h + 1) * L])
    # per head: attn_v_b[h] @ its latent output, into the output product's input
    xv = A.aV[0]
    for h in range(H):
        for i in range(L):
            xv[h, i] = lat[h * L + i]
    quantize_needed(P.need[l, 6], A.aV)
    per_head(runs, w[W_V_B], S.mhead, H, bp, pp, A.atab_v, addr_of(A.aQ[0][0]), nv, sp, ctr, nth)
    quantize_needed(P.need[l, 1], A.aQ)
    product(runs, w[W_O], bp, pp, addr_of(A.atab[A_Q]), addr_of(S.xb2), sp, ctr, nth)


@njit_fast
def shortconv_op(l, W, A, S, P, R, rs, nth):
    """Layer l's gated short convolution (``quantkit.model.layer.ShortConv``) of the normed input in A.aE
    into S.xb2: in_proj into S.rec (b, c, x), ``ops.shortconv`` over the layer's state row rs[l] (the last
    l_cache - 1 positions' b * x, updated in place) into the output product's input, out_proj."""
    w = W.wt[l]
    E = S.x.shape[0]
    bp, pp, sp = addr_of(W.buf), addr_of(W.pbuf), addr_of(W.sc)
    quantize_needed(P.need[l, 0], A.aE)
    bcx = S.rec[:3 * E]
    product(W.runs, w[W_Q], bp, pp, addr_of(A.atab[A_E]), addr_of(bcx), sp, W.ctr, nth)
    conv = R.conv[l]
    d = conv.shape[1] - 1
    shortconv(bcx.reshape(1, 3 * E), conv, rs[l, :d * E].reshape(d, E), A.aQ[0])
    quantize_needed(P.need[l, 1], A.aQ)
    product(W.runs, w[W_O], bp, pp, addr_of(A.atab[A_Q]), addr_of(S.xb2), sp, W.ctr, nth)


@njit_fast
def delta_net_op(l, W, A, S, P, R, D, rs, nth):
    """Layer l's gated DeltaNet (``quantkit.model.layer.DeltaNet``) of the normed input in A.aE into S.xb2:
    attn_qkv, attn_gate, ssm_ba into S.rec, ``ops.delta_net`` over the layer's state row rs[l] (updated in
    place) into the output product's input, ssm_out."""
    w = W.wt[l]
    bp, pp, sp = addr_of(W.buf), addr_of(W.pbuf), addr_of(W.sc)
    C, HV, SD = R.dn_conv.shape[1], R.dn_dt.shape[1], R.dn_norm.shape[1]
    VD = HV * SD
    quantize_needed(P.need[l, 0], A.aE)
    qkv, z, ba = S.rec[:C], S.rec[C:C + VD], S.rec[C + VD:C + VD + 2 * HV]
    aEp = addr_of(A.atab[A_E])
    product(W.runs, w[W_Q], bp, pp, aEp, addr_of(qkv), sp, W.ctr, nth)
    product(W.runs, w[W_K], bp, pp, aEp, addr_of(z), sp, W.ctr, nth)
    product(W.runs, w[W_V], bp, pp, aEp, addr_of(ba), sp, W.ctr, nth)
    delta_net(qkv.reshape(1, C), z.reshape(1, VD), ba.reshape(1, 2 * HV), R.dn_conv[l], R.dn_dt[l], R.dn_a[l],
              R.dn_norm[l], D.eps, R.dn_k[0], rs[l], A.aQ[0])
    quantize_needed(P.need[l, 1], A.aQ)
    product(W.runs, w[W_O], bp, pp, addr_of(A.atab[A_Q]), addr_of(S.xb2), sp, W.ctr, nth)


@njit_fast_parallel
def ffn_op(l, moe, W, A, S, P, M, nth):
    """Layer l's FFN of the normed input in A.aE into S.xb2: a dense GLU (``DenseFFN``), or
    (``MoeFFN``, ``moe``) the router, ``route_token`` and each chosen expert's GLU -- its rows alone --
    weighted and added in selection order (``weight_before``: each expert's input h times its weight,
    quantized again per expert, its output added as it is), then the shared expert times the sigmoid of its gate. Each
    GLU: gate and up with the activation (one parallel region), then down."""
    f = P.ffn[l]
    glu_kind = f.glu    # (locals only in a prange body: attn_op)
    w = W.wt[l]
    E = S.x.shape[0]
    xa = A.aE[0][0]
    o_0 = np.int64(0)
    ctr, mrow, runs = W.ctr, S.mrow, W.runs
    bp, pp, sp = addr_of(W.buf), addr_of(W.pbuf), addr_of(W.sc)
    aEp, hgp, hup, yep = addr_of(A.atab[A_E]), addr_of(S.hg), addr_of(S.hu), addr_of(S.ye)
    has_eb = moe and f.biases != 0
    hg, hu, gelu_tab = S.hg, S.hu, P.gelu_tab
    quantize_needed(P.need[l, 2], A.aE)
    n_used = 0
    if moe:
        n_used = P.routing[l].n_used
        product(W.runs, w[W_ROUTER], bp, pp, aEp, addr_of(S.rlog), sp, ctr, nth)
        if has_eb:
            add_bias(S.rlog, M.router_bias[l])
        route_token(S.rlog, M.score_bias[l], P.routing[l], S.sel, S.selw, S.rsc)
    xb2 = S.xb2
    for i in range(E):
        xb2[i] = 0.0
    n_sh = 1 if f.n_ff_shexp != 0 else 0
    w_before = moe and f.w_before != 0
    if w_before:
        S.hs[:] = xa
    for j in range(max(n_used, 1) + n_sh):
        shx = n_sh != 0 and j == max(n_used, 1)      # the shared expert, after the routed ones
        e = S.sel[j] if moe and not shx else 0
        if w_before:    # build_moe_ffn's weight_before_ffn: this expert's input is h times its weight
            wj = S.selw[j] if not shx else np.float32(1.0)
            for i in range(E):
                xa[i] = S.hs[i] * wj
            quantize_needed(P.need[l, 2], A.aE)
        m0 = W_GATE_SH if shx else W_GATE
        ai = A_S if shx else A_X if moe else A_F
        af = A.aS if shx else A.aX if moe else A.aF
        ha = af[0][0]                                # act(gate) * up, float32 (n_ff,)
        for r in range(3):
            for col in range(WT_COLS):
                mrow[r, col] = w[m0 + r, col]
            mrow[r, 0] += e * w[m0 + r, 5]
        mg, mu, md = mrow[0], mrow[1], mrow[2]
        gb, ub = M.gate_bias[l, e], M.up_bias[l, e]
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
                        hg[i] += gb[i]
                        hu[i] += ub[i]
                glu(hg[r0:r1], hu[r0:r1], ha[r0:r1], glu_kind, gelu_tab)
                c = fetch_add(ctr, CTR, 1)
        quantize_needed(P.need[l, 3], af)
        product(W.runs, md, bp, pp, addr_of(A.atab[ai]), yep, sp, ctr, nth)
        if has_eb and not shx:
            add_bias(S.ye, M.down_bias[l, e])
        we = S.selw[j] if moe and not shx and not w_before else np.float32(1.0)
        if shx and f.shexp_gate != 0:   # sigmoid(h . ffn_gate_inp_shexp)
            gs = np.float32(0.0)
            for i in range(E):
                gs += xa[i] * M.shexp_inp[l, i]
            we = np.float32(1.0) / (np.float32(1.0) + expf(-gs))
        for i in range(E):
            xb2[i] += S.ye[i] * we


def step_body(tok, pos, want, W, A, S, P, T, M, R, D, kc, vc, rs, cos, sin, scores, logits, nth):
    """Run token ``tok`` at position ``pos`` through every layer's program; the logits into ``logits``
    when ``want``. ``W``: the matrices (``Weights``: read from ``buf``, the file's map, or for x8 /
    copied slots ``pbuf``, by the row runners ``runs[slot]``, the embedding's row by ``deqs[slot]``);
    ``A`` the activation forms, ``S`` scratch, ``P`` the program and its records, ``T`` / ``M`` / ``R`` the
    attention's, the MoE's and the recurrent ops' per-layer tensors (each (n_layer, 0, ...) when no layer
    has them), ``D`` the dimensions and scales. kc/vc (n_layer, n_ctx, n_head_kv*head_dim) get this
    position's K and V; rs (n_layer, widest state) the recurrent layers' state, updated in place; cos /
    sin (n_tables, n_ctx, n_rot/2)."""
    x, xb2 = S.x, S.xb2
    xa = A.aE[0][0]             # the normed input of a block, float32 (E,)
    E = x.shape[0]
    nob = P.norms[0, 0, :0]     # an empty norm: "none"
    sp = addr_of(W.sc)
    et = W.et
    call_addr(W.deqs[et[3]], addr_of(W.buf), addr_of(W.pbuf), et[0], et[1], np.int64(tok), np.int64(tok) + 1,
              addr_of(A.atab[A_E]), addr_of(x), np.int64(0), sp)
    if D.embd_scale != np.float32(1.0):
        for i in range(E):
            x[i] *= D.embd_scale
    for l in range(P.prog.shape[0]):
        for bi in range(P.prog.shape[1]):
            blk = P.prog[l, bi]
            if blk.op == OP_NONE:
                continue
            # x += post(op(norm(x)))
            if blk.norm >= 0:
                rmsnorm1(x, P.norms[l, blk.norm], D.eps, xa)
            else:
                xa[:] = x
            if blk.op == OP_ATTN:
                ATTN(l, pos, W, A, S, P, T, D, kc, vc, cos, sin, scores, nth)  # noqa: F821
            elif blk.op == OP_MLA:
                MLA_OP(l, pos, W, A, S, P, T, D, kc, cos, sin, scores, nth)  # noqa: F821
            elif blk.op == OP_SHORTCONV:
                shortconv_op(l, W, A, S, P, R, rs, nth)
            elif blk.op == OP_DELTANET:
                delta_net_op(l, W, A, S, P, R, D, rs, nth)
            else:
                ffn_op(l, blk.op == OP_MOE, W, A, S, P, M, nth)
            if blk.scale != np.float32(0.0):   # post-norm first, then the scale (layer.Block)
                if blk.post >= 0:
                    rmsnorm1(xb2, P.norms[l, blk.post], D.eps, xb2)
                for i in range(E):
                    x[i] += xb2[i] * blk.scale
            else:
                add_block(x, xb2, P.norms[l, blk.post] if blk.post >= 0 else nob, D.eps)
    if want:
        rmsnorm1(x, P.out_norm, D.eps, xa)
        quantize_needed(P.need[P.prog.shape[0], 0], A.aE)
        product(W.runs, W.ot, addr_of(W.buf), addr_of(W.pbuf), addr_of(A.atab[A_E]), addr_of(logits), sp, W.ctr,
                nth)


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


@njit_fast
def _no_mla(l, pos, W, A, S, P, T, D, kc, cos, sin, scores, nth):
    """``mla_op``'s stand-in in the step of a model without MLA layers (never called there)."""
    return


def step_kernel(kv_f16: bool, mla: bool = False):
    """The compiled step for a KV cache kind (fp16 bits or float32), with ``mla_op`` when ``mla``: one
    build for every model of each (a model without MLA layers does not compile ``mla_op``'s parallel
    regions on its first run)."""
    tag = "kv16" if kv_f16 else "kv32"
    st = kv_f16_store if kv_f16 else kv_f32_same
    attn = build(attn_op, tag, True, ST_KV=st, ATTEND=attend_kernel(kv_f16))
    mla_fn = build(mla_op, tag, True, ST_KV=st, ATTEND=attend_kernel(kv_f16)) if mla else _no_mla
    return build(step_body, tag + ("_mla" if mla else ""), False, ATTN=attn, MLA_OP=mla_fn)


class DecodeStep:
    """The flat tables and buffers of one model for ``step_body``; ``run(runner, tok, pos, logits)``."""

    def __init__(self, model: Llama, kv_f16: bool, variant: str | None = None):
        variant = variant or default_variant()
        if variant == "plain":
            raise ModelError("the compiled decode step needs the integer kernels (not QUANTKIT_KERNELS=plain)")
        c = model.config
        # the step walks each layer's program (quantkit.model.layer): ops it has, at most MAX_BLOCKS a layer
        for il, d in enumerate(model.layers):
            if len(d.blocks) > MAX_BLOCKS or any(type(k.op) not in OP_CODES for k in d.blocks):
                raise ModelError(f"the compiled decode step has no op for layer {il}'s {d}")
        # per layer, its matrices by slot (``_layer_mats``)
        per_layer = [{j: getattr(b, name) for j, name in _layer_mats(d, b).items()}
                     for d, b in zip(model.layers, model.blk)]
        mats = [w for ws in per_layer for w in ws.values()]
        weights = mats + [model.output, model.token_embd]
        types = tuple(sorted({w.type for w in weights}, key=int))
        # the products of an x8 type with whole 8-row groups read an interleaved copy (not the embedding,
        # which is looked up by row from the map)
        # and the float matrices read the step's own copy of their rows (``copies_rows``), unless the
        # whole span is copied already (QUANTKIT_COPY_WEIGHTS=1)
        xt = set(x8_types(variant)) if use_x8(variant) else set()
        ct = {t for t in types if copies_rows(t)} if not config.copy_weights() else set()
        # (ffn_gate_up_exps: each half of an expert's rows in whole 8-row groups)
        fused = {b.ffn_gate_up_exps.name for b in model.blk if b.ffn_gate_up_exps is not None}
        packed = [w.type in ct or (w.type in xt and (w.data.shape[0] // w.n_expert // (2 if w.name in fused else 1))
                                   % X8_ROWS == 0) for w in weights[:-1]] + [False]

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
        wt = np.zeros((c.n_layer, N_MATS, WT_COLS), np.int64)   # a layer's unused slots: empty
        i = 0
        for il, ws in enumerate(per_layer):
            for j in ws:
                wt[il, j] = tab[i]
                i += 1
            if W_GATE in ws and ws[W_GATE].name in fused:
                # ffn_gate_up_exps: W_GATE the first half of each expert's rows, W_UP the second (the expert
                # stride stays the whole expert's)
                n = wt[il, W_GATE, 2] // 2
                wt[il, W_GATE, 2], wt[il, W_GATE, 4] = n, chunk_rows(n)
                wt[il, W_UP] = wt[il, W_GATE]
                wt[il, W_UP, 0] += n * ws[W_GATE].data.shape[1]
        self.wt = wt
        self.ot = np.ascontiguousarray(tab[len(mats)])
        self.et = np.ascontiguousarray(tab[len(mats) + 1])

        def bits(ws: dict, *slots: int) -> int:
            return int(np.bitwise_or.reduce([0] + [KIND_BIT[activation_kind(ws[j].type, variant)] for j in slots
                                                   if j in ws]))

        need = np.zeros((c.n_layer + 1, N_NEED), np.int64)
        for i, ws in enumerate(per_layer):
            # attention's input (MLA: attn_q_a's or attn_q's and attn_kv_a_mqa's); attn_output's; the FFN's
            # (and the router's, the shared expert's gate / up); ffn_down's (and the shared expert's); MLA's
            # attn_q_b's, attn_k_b's, attn_v_b's
            mla = isinstance(model.layers[i].attn, MLA)
            need[i] = (bits(ws, W_K, W_V) | (0 if mla and W_V in ws else bits(ws, W_Q)), bits(ws, W_O),
                       bits(ws, W_GATE, W_UP, W_ROUTER, W_GATE_SH, W_UP_SH), bits(ws, W_DOWN, W_DOWN_SH),
                       bits(ws, W_Q) if mla else 0, bits(ws, W_K_B), bits(ws, W_V_B))
        need[c.n_layer, 0] = bits({0: model.output}, 0)
        self.program = _program(model, need)
        ffns = [d.ffn for d in model.layers]
        n_ff = max([f.n_ff for f in ffns if isinstance(f, DenseFFN)], default=0)
        n_ff_exp = max([f.n_ff for f in ffns if isinstance(f, MoeFFN)], default=0)
        n_shexp = max([f.n_ff_shexp for f in ffns if isinstance(f, MoeFFN)], default=0)
        n_expert = max([f.n_expert for f in ffns if isinstance(f, MoeFFN)], default=1)
        k = max([f.n_expert_used for f in ffns if isinstance(f, MoeFFN)], default=1)
        mlas = [d.attn for d in model.layers if isinstance(d.attn, MLA)]
        # the attention's output: n_head * head_dim, or an MLA layer's n_head * n_v
        n_att = max([c.n_embd if isinstance(d.recurrent, ShortConv) else d.recurrent.value_dim
                     if isinstance(d.recurrent, DeltaNet) else c.n_embd_q if not isinstance(d.attn, MLA)
                     else d.attn.n_head * d.attn.n_v for d in model.layers])
        gated = any(isinstance(d.attn, Attn) and d.attn.gate for d in model.layers)
        n_lq, n_nope, n_lkv = (max([getattr(a, f) for a in mlas], default=0)
                               for f in ("n_lora_q", "n_nope", "n_lora_kv"))
        n_mh = max([a.n_head for a in mlas], default=1)
        acts = [_activations(n or 32, r) for n, r in ((c.n_embd, 1), (n_att, 1), (n_ff, 1), (n_ff_exp, 1),
                                                        (n_shexp, 1), (n_lq, 1), (n_nope, n_mh), (n_lkv, n_mh))]
        self.acts = Acts(*acts, np.stack([act_table(a) for a in acts]), _row_tables(acts[A_N]),
                         _row_tables(acts[A_V]))
        n_mla = max([a.n_q + a.kv_width + a.n_lora_q + a.n_head * (a.kv_width + a.n_lora_kv) for a in mlas], default=1)
        width = max(n_ff, n_ff_exp, n_shexp)
        self.scratch = Scratch(x=np.zeros(c.n_embd, np.float32), xb2=np.zeros(c.n_embd, np.float32),
                               qkv=np.zeros(c.n_embd_q * (2 if gated else 1) + 2 * c.n_embd_kv, np.float32),
                               hg=np.zeros(width, np.float32), hu=np.zeros(width, np.float32),
                               ye=np.zeros(c.n_embd, np.float32), rlog=np.zeros(n_expert, np.float32),
                               rsc=np.zeros(2 * n_expert, np.float32), sel=np.zeros(k, np.int64),
                               selw=np.zeros(k, np.float32), mrow=np.zeros((3, WT_COLS), np.int64),
                               mla=np.zeros(n_mla, np.float32), mhead=np.zeros((n_mh, WT_COLS), np.int64),
                               hs=np.zeros(c.n_embd, np.float32),
                               rec=np.zeros(max([3 * c.n_embd if isinstance(d.recurrent, ShortConv) else
                                                 d.recurrent.conv_dim + d.recurrent.value_dim + 2 * d.recurrent.n_v_heads
                                                 if isinstance(d.recurrent, DeltaNet) else 1 for d in model.layers] +
                                                [c.n_embd_q if gated else 1]), np.float32))
        blk = model.blk

        def stacked(name: str, shape) -> np.ndarray:
            return _stacked([getattr(b, name) for b in blk], shape)

        # per layer the Q norm's weights then the K norm's (per head: 2 head_dim; qk_norm_full: Q + KV)
        qkn = [None if b.attn_q_norm is None else np.concatenate([b.attn_q_norm, b.attn_k_norm]) for b in blk]
        width = max([v.size for v in qkn if v is not None], default=0)
        qkn = [None if v is None else np.pad(v, (0, width - v.size)) for v in qkn]
        self.attn_tables = AttnTables(bias=layer_biases(model), qk_norm=_stacked(qkn, width),
                                      sinks=stacked("attn_sinks", c.n_head),
                                      out_bias=stacked("attn_output_bias", c.n_embd),
                                      q_a_norm=stacked("attn_q_a_norm", n_lq),
                                      kv_a_norm=stacked("attn_kv_a_norm", n_lkv))
        shg = [None if b.ffn_gate_inp_shexp is None else b.ffn_gate_inp_shexp.dequantize().reshape(-1) for b in blk]
        self.moe_tables = MoeTables(shexp_inp=_stacked(shg, c.n_embd),
                                    router_bias=stacked("ffn_gate_inp_bias", n_expert),
                                    score_bias=stacked("exp_probs_b", n_expert),
                                    gate_bias=stacked("ffn_gate_exps_bias", (n_expert, n_ff_exp)),
                                    up_bias=stacked("ffn_up_exps_bias", (n_expert, n_ff_exp)),
                                    down_bias=stacked("ffn_down_exps_bias", (n_expert, c.n_embd)))
        dns = [d.recurrent for d in model.layers if isinstance(d.recurrent, DeltaNet)]
        dn = dns[0] if dns else DeltaNet(1, 1, 0, 1)
        self.rec_tables = RecTables(conv=_stacked([b.shortconv_conv for b in blk], (c.n_embd, max(c.l_cache, 1))),
                                    dn_conv=_stacked([b.ssm_conv1d for b in blk], (dn.conv_dim, dn.d_conv)),
                                    dn_dt=stacked("ssm_dt_bias", dn.n_v_heads), dn_a=stacked("ssm_a", dn.n_v_heads),
                                    dn_norm=stacked("ssm_norm", dn.head_dim), dn_k=np.array([dn.n_k_heads], np.int64))
        self.dims = Dims(n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim, n_rot=c.n_rot,
                         eps=np.float32(c.rms_eps), scale=np.float32(c.kq_scale), embd_scale=np.float32(c.embd_scale))
        # the slot table: each slot's row runner (unused slots repeat slot 0) and embedding lookup
        pad = list(slots) + [slots[0]] * (SLOTS - len(slots))
        # (the runners' addresses: int64 arrays, which numba types in no time, where a tuple of the
        # runners themselves took ~140 us a token to type; ``runners`` keeps their code alive)
        self.runners = [(row_runner(t, x8, variant), deq_runner(t)) for t, x8 in pad]
        self.runs = np.array([r.address for r, _ in self.runners], np.int64)
        self.deqs = np.array([d.address for _, d in self.runners], np.int64)
        self.sc = np.zeros(SC_LEN, np.int32)
        self.ctr = np.zeros(2 * CTR, np.int64)
        self.fn = step_kernel(kv_f16, any(isinstance(d.attn, MLA) for d in model.layers))

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

    def run(self, tok: int, pos: int, kc, vc, rs, cos, sin, scores, logits, want: bool) -> None:
        """``rs`` (n_layer, widest state) the recurrent state (Runner.state), ``cos`` / ``sin`` (n_tables,
        n_ctx, n_rot/2), ``scores`` (n_head, n_ctx): as ``step_body``'s."""
        if self._x8_todo:
            self.make_x8()
        w = Weights(self.runs, self.deqs, self.buf, self.pbuf, self.wt, self.ot, self.et, self.sc, self.ctr)
        self.fn(tok, pos, want, w, self.acts, self.scratch, self.program, self.attn_tables, self.moe_tables,
                self.rec_tables, self.dims, kc, vc, rs, cos, sin, scores, logits, get_threads())


def _layer_mats(d, b) -> dict[int, str]:
    """The matrices of a layer whose program is ``d`` and tensors ``b``: the ``wt`` slot of each."""
    names = MATS if not d.moe else MOE_MATS + (SHEXP_MATS if d.ffn.n_ff_shexp else ())
    out = dict(enumerate(names))
    if d.recurrent is not None:
        out = {j: n for j, n in out.items() if j >= W_GATE}
        out.update(SHORTCONV_MATS if isinstance(d.recurrent, ShortConv) else DELTANET_MATS)
    if isinstance(d.attn, MLA):
        out.update(MLA_MATS)
        out[W_Q] = "attn_q_b" if d.attn.n_lora_q else "attn_q"
    if d.moe and d.ffn.gate_up:     # W_UP's rows come from the same tensor (DecodeStep splits the slot)
        out[W_GATE] = "ffn_gate_up_exps"
    return {j: name for j, name in out.items() if getattr(b, name) is not None}


def _program(model: Llama, need: np.ndarray) -> Program:
    """The layer programs as the step's records (the section's comment), their norms and parameters."""
    c, layers = model.config, model.layers
    prog = np.zeros((c.n_layer, MAX_BLOCKS), BLOCK_DTYPE)
    norms = np.zeros((c.n_layer, 2 * MAX_BLOCKS, c.n_embd), np.float32)
    attn = np.zeros(c.n_layer, ATTN_DTYPE)
    mla = np.zeros(c.n_layer, MLA_DTYPE)
    ffn = np.zeros(c.n_layer, FFN_DTYPE)
    routing = np.zeros(c.n_layer, ROUTING_DTYPE)
    for il, (d, b) in enumerate(zip(layers, model.blk)):
        for bi, k in enumerate(d.blocks):
            rows = []
            for j, name in enumerate((k.norm, k.post_norm)):
                if name:
                    norms[il, 2 * bi + j] = getattr(b, name)
                rows.append(2 * bi + j if name else -1)
            prog[il, bi] = (OP_CODES[type(k.op)], *rows, k.scale)
        a, f = d.attn, d.ffn
        if isinstance(a, MLA):
            mla[il] = (a.rope_table, a.rope_neox, a.n_head, a.n_lora_q, a.n_lora_kv, a.n_nope, a.n_rot, a.n_v)
        elif isinstance(a, Attn):
            attn[il] = (a.rope_table, a.window, a.rope_neox, a.qk_norm, a.qkv_bias, a.sinks, a.out_bias, a.rope,
                        a.qk_norm_full, a.softcap, a.l2_norm, a.temp_floor, a.temp_scale, a.temp_offset, a.gate)
        shexp = f.n_ff_shexp if isinstance(f, MoeFFN) else 0
        moe = isinstance(f, MoeFFN)
        ffn[il] = (GLU_KINDS.index(f.glu), f.n_ff, shexp, moe and f.shexp_gate, moe and f.biases,
                   moe and f.weight_before)
        routing[il] = routing_record(f.routing if isinstance(f, MoeFFN) else None)[0]
    gelu = gelu_table() if any(d.ffn.glu == "gelu" for d in layers) else np.zeros(1, np.float32)
    return Program(prog=prog, norms=norms, attn=attn, mla=mla, ffn=ffn, routing=routing, need=need,
                   out_norm=np.ascontiguousarray(model.output_norm, np.float32), gelu_tab=gelu)


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


def _stacked(vs: list, shape) -> np.ndarray:
    """float32 (n_layer, *shape) of per-layer arrays (None: zeros where a layer lacks one), or with a last
    dimension of 0 when every layer lacks it."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if all(v is None for v in vs):
        return np.zeros((len(vs),) + shape[:-1] + (0,), np.float32)
    return np.ascontiguousarray(np.stack([np.zeros(shape, np.float32) if v is None else v for v in vs]), np.float32)


def _activations(n: int, rows: int = 1) -> tuple:
    """Every activation form of ``rows`` input vectors of n elements (see ``urow_q8_0``), each (rows, ...)."""
    nb32, nbk = n // 32, n // 256
    r = rows
    return (np.zeros((r, n), np.float32), np.zeros((r, n), np.int8), np.zeros((r, nb32), np.float32),
            np.zeros((r, nb32), np.int32), np.zeros((r, nb32), np.float32), np.zeros((r, n), np.int8),
            np.zeros((r, nbk), np.float32), np.zeros((r, n // 16), np.int32), np.zeros((r, n), np.float32),
            np.zeros((r, n), np.float32))


def _row_tables(a: tuple) -> np.ndarray:
    """int64 (rows, 20): per row of the activation forms ``a`` (``_activations(n, rows)``), the table
    ``act_table`` would give for that row alone (each form's address moved on by the row)."""
    t = act_table(a)
    step = np.array([v for x in a for v in (x.strides[0], 0)], np.int64)
    return np.ascontiguousarray(t[None, :] + np.arange(a[0].shape[0], dtype=np.int64)[:, None] * step[None, :])


__all__ = ["attend_kernel", "exp_shift_sum", "expf", "gelu_table", "glu", "kv_f16_store", "kv_f32_same",
           "max_f32", "qk_prepare", "rmsnorm1", "window_start", "DecodeStep", "MATS", "MOE_MATS", "SHEXP_MATS",
           "STEP_MATS", "SLOTS", "step_kernel"]
