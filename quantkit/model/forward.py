"""The llama forward pass, llama2.c style: a run state allocated once and one straight loop over layers.

``Runner(model, n_ctx)`` owns every buffer (activations for up to ``n_batch`` tokens, the RoPE table
and the KV cache) so a step allocates nothing but the logits it returns.
``runner.forward(tokens, pos0)`` runs a batch of tokens at positions pos0, pos0+1, ... -- the prompt
in one go (matrix x matrix products, at most ``n_batch`` rows per pass), or one token while decoding --
and returns the logits of the rows asked for (the last token by default).

Choices, and why:

* KV cache in float32 by default, shape (n_layer, n_ctx, n_head_kv * head_dim) per K and V (MLA layers:
  the latent and k_pe in the K rows, no V; ``kv_widths``);
  ``type_kv="f16"`` stores fp16 as llama.cpp does by default (half the attention's memory traffic).
  Against llama.cpp's golden ids fp16 measured no better (equal top-1 agreement over 400 positions)
  and flipped one greedy step where llama.cpp's top-2 gap is 0.26, so float32 stays the default
  (docs/run.md). ``np.zeros`` maps the cache lazily, so only the positions used take memory.
* What differs between architectures and layers is data: each layer's ``quantkit.model.layer.Layer``
  program (its blocks' norms and ops: attention with its RoPE style, Q/K/V biases, per-head Q/K norms,
  sliding window and RoPE table; a dense GLU, or a mixture of experts with its routing), which ``_step``
  walks with one method per op (``_attention_block``, ``_dense_block``, ``_moe_block``), and the config's
  embedding scale, attention scale, output bias and soft-cap. The per-token ops (``qk_prepare``, ``glu``,
  ``rmsnorm1``, ``attend_head``) are the decode step's, run here per row. The cos/sin tables are built
  like ggml's rope cache (theta multiplied by theta_scale step by step in float32), and ``rope_freqs``
  divides theta when the model has it.
* One token (decoding) runs ``quantkit.model.decode``'s compiled step: every layer in one numba call
  (a MoE layer's experts included: it reads only the chosen experts' rows).
* A MoE FFN (``_moe_block``, llama.cpp's build_moe_ffn): router logits, routing (``route.route_rows``,
  the decode step's ``route_token`` per row), then for each
  expert that some token chose, its three products on just those tokens' rows (ggml's mul_mat_id),
  on that expert's 2D slice of the memory-mapped 3D tensor; the weighted outputs are added per token
  in the order of selection.
  A batch runs the per-layer loop below: the matrix products are ``quantkit.kernels.matmul`` on the
  memory-mapped quantized weights (GEMV under 32 rows, an integer GEMM or dequantized weights + BLAS
  from 32; see docs/kernels.md), attention
  is BLAS products per KV head from 32 rows (a numba kernel below), and the small ops (RMSNorm, RoPE +
  cache store, softmax, the GLU) are numba kernels; BLAS is limited to numba's thread count.
* ``collect``: set to a callable ``(weight_name, x)`` to see the input of every matrix product with at
  least ``COLLECT_MIN_ROWS`` rows (the imatrix collector; x (n_head, rows, n_in) for MLA's per-head
  attn_k_b / attn_v_b), and ``(weight_name, x, (expert, n_expert))``
  for each expert's rows of a MoE FFN (any number: llama-imatrix collects every mul_mat_id); ``None``
  costs one comparison per product.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from quantkit.errors import ModelError
from quantkit.jit import get_threads, njit_fast, njit_fast_parallel, prange
from quantkit.kernels.ir import default_variant
from quantkit.kernels import blas_limit, get_rows, matmul
from quantkit.kernels.mul_mat import blas_one_thread
from quantkit.kernels.vecdot import build
from quantkit.model.arch import GLU_KINDS
from quantkit.model.decode import (STEP_MATS, DecodeStep, attend_kernel, gelu_table, glu,
                                   kv_f16_store, kv_f32_same, layer_biases, qk_prepare, rmsnorm1, window_start)
from quantkit.model.layer import MLA, Attn, DeltaNet, DenseFFN, MoeFFN, ShortConv
from quantkit.model.llama import Block, Llama, Weight, yarn_ramp
from quantkit.model.ops import (NO_SINK, attn_temperature, delta_net, exp_sink_inv, mla_prepare, qk_finish, shortconv,
                                 softcap_scores)
from quantkit.model.route import route_rows, routing_record

COLLECT_MIN_ROWS = 16
DEFAULT_N_BATCH = 512
#: the KV cache element type: float32 by default; "f16" (llama.cpp's default) is an option -- it
#: measured no better against llama.cpp's golden ids and lost one greedy prompt (docs/run.md)
DEFAULT_TYPE_KV = "f32"


# -- small ops: output arrays first in the docs, inputs never modified unless said -----------------

@njit_fast_parallel
def rmsnorm(x, w, eps, out):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (the decode step's ``rmsnorm1`` per row; out may be
    x). One row per iteration (as in every small op here): the same values for any thread count."""
    for r in prange(x.shape[0]):
        rmsnorm1(x[r], w, eps, out[r])


def _prepare_store(q, k, v, kc, vc, pos0, cos, sin, qb, kb, vb, qn, kn, full, eps, n_head, n_head_kv, head_dim,
                   n_rot, neox, l2, tf, ts, to):
    """Per token: the decode step's ``qk_prepare`` on q, k, v in place (biases, q/k norms, RoPE) and
    ``qk_finish`` (the temperature ``attn_temperature(p, tf, ts, to)``, the L2 norm when ``l2``), then
    k and v into cache rows pos0.. (ST_KV: float32 -> the cache's element, fp16 bits or float32)."""
    n = q.shape[0]
    for t in prange(n):
        p = pos0 + t
        qk_prepare(q[t], k[t], v[t], qb, kb, vb, qn, kn, full, eps, n_head, n_head_kv, head_dim, n_rot, cos[p],
                   sin[p], neox)
        qk_finish(q[t], k[t], n_head, n_head_kv, head_dim, l2, eps, attn_temperature(p, tf, ts, to))
        for j in range(k.shape[1]):
            kc[p, j] = ST_KV(k[t, j])  # noqa: F821
            vc[p, j] = ST_KV(v[t, j])  # noqa: F821


def _attention(q, kc, vc, pos0, n_head, n_head_kv, head_dim, head_dim_v, scale, softcap, n_swa, sinks, out):
    """Causal grouped-query attention: query t (at pos0+t), head h (q's columns h*head_dim..) sees cache
    rows 0..pos0+t (from ``window_start``'s with a sliding window or chunks) of kv head h // (n_head / n_head_kv):
    its keys at column kvh*head_dim of kc, its values at column kvh*head_dim_v of vc, its logits
    soft-capped by ``softcap`` (0: not), with its sink logit sinks[h] (empty: none). out (n,
    n_head*head_dim_v). (MLA: one kv head, vc = kc, the latent's width head_dim_v.) One (t, h) pair per
    iteration (the decode step's ``attend_head``), so the result does not depend on the thread count."""
    n = q.shape[0]
    group = n_head // n_head_kv
    for th in prange(n * n_head):
        t = th // n_head
        h = th - t * n_head
        n_kv = pos0 + t + 1
        k0 = window_start(n_kv, n_swa)
        sink = sinks[h] if sinks.shape[0] else np.float32(NO_SINK)
        ATTEND(q[t, h * head_dim:(h + 1) * head_dim], kc, vc, (h // group) * head_dim,  # noqa: F821
               (h // group) * head_dim_v, k0, n_kv, scale, softcap, sink, np.empty(n_kv - k0, np.float32),
               out[t, h * head_dim_v:(h + 1) * head_dim_v])


def _mla_prepare_store(q, kv, kc, pos0, cos, sin, kv_norm, eps, n_head, n_nope, n_rot, neox):
    """Per token: the decode step's ``mla_prepare`` on q (n_head heads of n_nope + n_rot) and kv (the
    latent, then k_pe) in place -- RoPE on each head's last n_rot dims and on k_pe, the latent's RMSNorm --,
    then kv into cache row pos0.. (ST_KV)."""
    for t in prange(q.shape[0]):
        p = pos0 + t
        mla_prepare(q[t], kv[t], kv_norm, eps, n_head, n_nope, n_rot, cos[p], sin[p], neox)
        for j in range(kv.shape[1]):
            kc[p, j] = ST_KV(kv[t, j])  # noqa: F821


def kv_kernels(kv_f16: bool):
    """(prepare_store, attention_serial, attention_parallel, mla_prepare_store) for an fp16-bits (uint16)
    or float32 cache. The attention body is compiled serial for a few tokens (a parallel launch costs more
    than 9 heads of work) and parallel over (token, head) pairs for more."""
    tag = "kv16" if kv_f16 else "kv32"
    st = kv_f16_store if kv_f16 else kv_f32_same
    att = attend_kernel(kv_f16)
    return (build(_prepare_store, tag, True, ST_KV=st), build(_attention, tag, False, ATTEND=att),
            build(_attention, tag, True, ATTEND=att), build(_mla_prepare_store, tag, True, ST_KV=st))


PARALLEL_ATTENTION_MIN_TOKENS = 4
#: from this many tokens on, attention is matrix products (BLAS) over blocks of ATTN_BLOCK queries
BLAS_ATTENTION_MIN_TOKENS = 32
#: (a block computes its queries against every key up to its last query: smaller blocks skip more of
#: the masked half; 16 layers of a 512-token attention at the 1B shape, 1 thread, CPU s: 0.31 / 0.27 /
#: 0.25 at 256 / 128 / 64, 2026-12-01)
ATTN_BLOCK = 64


@njit_fast(inline="always")
def _softmax_row(row, lo, lim, scale, softcap, sink):
    """row[lo:lim] <- softmax(scale * row[lo:lim]), the rest <- 0, in ggml's non-flash-attention op
    order (scale, max, exp, float32 sum, multiply by 1 / sum), the scaled logits soft-capped first
    (``softcap_scores``; 0: not); a ``sink`` logit (NO_SINK: none) joins
    the max and the sum (ggml_soft_max_add_sinks) -- deferring the division to the rows
    of S @ V measured the same speed and moved the quantized files' results away from llama.cpp's.
    A 1-D contiguous row in its own function: inlined into the prange body below, the loops stay
    vectorized (written there directly they were lowered with scattered stores)."""
    w = row[lo:]
    m = lim - lo
    for j in range(m):
        w[j] *= scale
    softcap_scores(w, m, softcap)
    inv = exp_sink_inv(w, m, sink)
    for j in range(m):
        w[j] *= inv
    row[:lo] = 0.0
    row[lim:] = 0.0


def _causal_softmax(S, first, group, scale, softcap, n_swa, sinks):
    """S (rows, nk): scores, row r belonging to query r // group and head r % group of the group, which
    sees keys 0..first + r // group (from ``window_start``'s with a sliding window or chunks), with that head's
    sink logit sinks[r % group] (empty: none). In place: softmax of scale * S over the keys each row
    sees, zeros elsewhere. One row per iteration."""
    m, nk = S.shape
    for r in prange(m):
        lim = min(first + r // group + 1, nk)
        sink = sinks[r % group] if sinks.shape[0] else np.float32(NO_SINK)
        _softmax_row(S[r], window_start(lim, n_swa), lim, scale, softcap, sink)


causal_softmax = njit_fast_parallel(_causal_softmax)
#: the same, serial: the batch attention calls it from its per-KV-head threads
causal_softmax_serial = njit_fast(_causal_softmax)

_POOL: dict = {}


def _head_pool(n: int) -> ThreadPoolExecutor:
    """A pool of ``n`` threads for the batch attention's KV heads (made once per thread count)."""
    if n not in _POOL:
        _POOL[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="quantkit-attn")
    return _POOL[n]


@njit_fast_parallel
def glu_rows(gate, up, kind, table):
    """gate <- act(gate) * up per row (the decode step's ``glu``: SiLU or ggml's table GELU). Through a
    row buffer: written in place, LLVM's run-time alias check sends ``glu`` to its scalar loop (SiLU 3.6
    against 0.18 ns per element, 1 thread; 0.14 CPU s of a 512-token pass at the 1B shape)."""
    for r in prange(gate.shape[0]):
        row = np.empty(gate.shape[1], np.float32)
        glu(gate[r], up[r], row, kind, table)
        gate[r] = row


def rope_table(n_ctx: int, n_rot: int, freq_base: float, freq_scale: float = 1.0,
               freq_factors: np.ndarray | None = None, ramp: np.ndarray | None = None,
               mscale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 (n_ctx, n_rot/2) as ggml_rope_cache_init: theta_i = p * theta_scale^i, the power
    built by repeated float32 multiplication, divided by freq_factors[i], times freq_scale; with YaRN
    (``ramp``: llama.yarn_ramp) that interpolated angle mixed with the unscaled one by ramp[i] and cos /
    sin times ``mscale`` (ggml's rope_yarn)."""
    half = n_rot // 2
    theta_scale = np.float32(freq_base ** (-2.0 / n_rot))
    steps = np.empty((n_ctx, half), np.float32)
    steps[:, 0] = np.arange(n_ctx, dtype=np.float32)
    steps[:, 1:] = theta_scale
    theta = np.cumprod(steps, axis=1, dtype=np.float32)
    if freq_factors is not None:
        theta = (theta / freq_factors.astype(np.float32)).astype(np.float32)
    interp = (np.float32(freq_scale) * theta).astype(np.float32)
    if ramp is not None:
        interp = (interp * (np.float32(1.0) - ramp) + theta * ramp).astype(np.float32)
    ms = np.float32(mscale)
    return (np.cos(interp) * ms).astype(np.float32), (np.sin(interp) * ms).astype(np.float32)


_MALLOC_TUNED = False


def _keep_freed_buffers() -> None:
    """glibc only: keep freed buffers of up to 32 MiB in the heap instead of returning them to the OS.
    A batch pass frees and reallocates MB-sized arrays for every product (rounded activations, weight
    tiles, attention scores); by default each comes back as fresh pages, and the page faults cost ~5 %
    of a perplexity run in system time. Process-wide, so only processes that run the model call it
    (through Runner), never quantize with its memory bound."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 256 << 20)
    except (OSError, AttributeError):
        pass


def return_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim; nothing elsewhere): what
    ``_keep_freed_buffers`` keeps for the next batch. bench calls it before each test, which would
    otherwise count the previous test's freed prompt buffers in its peak RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def kv_widths(model: Llama) -> tuple[int, int]:
    """The KV cache's row widths (K, V) for every layer of ``model``: the widest layer's. An Attn
    layer stores n_head_kv * head_dim keys and as many values; an MLA layer its latent and k_pe
    (``MLA.kv_width``) in the K row and nothing in the V row (its values are the latent)."""
    c = model.config
    ks, vs = [0], [0]
    for d in model.layers:
        if isinstance(d.attn, MLA):
            ks.append(d.attn.kv_width)
        else:
            ks.append(c.n_embd_kv)
            vs.append(c.n_embd_kv)
    return max(ks), max(vs)


class Runner:
    """Run state for one sequence: buffers for ``n_batch`` tokens and a KV cache of ``n_ctx`` positions.

    ``type_kv``: "f32" (default) or "f16" (llama.cpp's default cache type). ``key_cache`` / ``value_cache`` are
    numpy arrays (n_layer, n_ctx, width) of that type (``kv_widths``). One-token calls run the compiled
    decode step (``quantkit.model.decode``) unless ``compiled_step=False`` or the model cannot use it
    (``self.step`` is then None)."""

    def __init__(self, model: Llama, n_ctx: int | None = None, n_batch: int = DEFAULT_N_BATCH,
                 type_kv: str = DEFAULT_TYPE_KV, compiled_step: bool = True):
        c = model.config
        n_ctx = c.n_ctx_train if not n_ctx else int(n_ctx)
        if n_ctx <= 0:
            raise ModelError(f"context size must be positive, got {n_ctx}")
        if n_ctx > c.n_ctx_train:
            raise ModelError(f"context size {n_ctx} is over the model's trained context length {c.n_ctx_train}")
        if type_kv not in ("f16", "f32"):
            raise ModelError(f"KV cache type must be 'f16' or 'f32', got {type_kv!r}")
        _keep_freed_buffers()
        self.model, self.config = model, c
        self.n_ctx = n_ctx
        self.n_batch = max(1, min(int(n_batch), n_ctx))
        self.n_past = 0                      # positions of the cache that hold valid keys/values
        self.collect: Callable[..., None] | None = None
        self.type_kv = type_kv
        B, E, Q, KV, F = self.n_batch, c.n_embd, c.n_embd_q, c.n_embd_kv, c.n_ff
        f32 = np.float32
        self.x = np.zeros((B, E), f32)       # residual stream
        self.xb = np.zeros((B, E), f32)      # normed input of a block
        self.xb2 = np.zeros((B, E), f32)     # output of a block, before the residual add
        self.q = np.zeros((B, Q), f32)
        self.k = np.zeros((B, KV), f32)
        self.v = np.zeros((B, KV), f32)
        self.att = np.zeros((B, Q), f32)     # attention output, heads concatenated
        # attn_q's rows of a gated attention (Attn.gate): per head its query, then its output gate
        self.qg = np.zeros((B, 2 * Q) if any(getattr(d.attn, "gate", False) for d in model.layers) else (0, 0), f32)
        F = max([d.ffn.n_ff for d in model.layers if isinstance(d.ffn, DenseFFN)], default=0)
        self.gate = np.zeros((B, F), f32)    # ffn_gate, then act(gate) * up (dense FFN layers)
        self.up = np.zeros((B, F), f32)
        kv16 = type_kv == "f16"
        kvt = np.float16 if kv16 else f32
        # each layer's state in rows of the widest layer's: an Attn layer's K and V (n_head_kv * head_dim
        # each), an MLA layer's latent and k_pe in its K row (MLA.kv_width; its values are the latent)
        KC, VC = kv_widths(model)
        self.key_cache = np.zeros((c.n_layer, n_ctx, KC), kvt)    # lazily mapped by the OS
        self.value_cache = np.zeros((c.n_layer, n_ctx, VC), kvt)
        # what the kernels see: fp16 as its bits (numba has no float16 arrays)
        self._kc = self.key_cache.view(np.uint16) if kv16 else self.key_cache
        self._vc = self.value_cache.view(np.uint16) if kv16 else self.value_cache
        self._prepare_store, self._attn_serial, self._attn_parallel, self._mla_prepare_store = kv_kernels(kv16)
        # RoPE tables (n_tables, n_ctx, n_rot/2): [0] the full-attention layers', [1] the sliding ones'
        # (their own base and scale, no factors: llama_model::get_rope_freq_base / _scale; YaRN's mix
        # and magnitude, when the model has it, apply to both)
        tabs = [rope_table(n_ctx, c.n_rot, c.rope_freq_base, c.rope_freq_scale, model.rope_freqs,
                           yarn_ramp(c, c.rope_freq_base), c.rope_mscale)]
        if any(c.swa_layers):
            tabs.append(rope_table(n_ctx, c.n_rot, c.rope_freq_base_swa, c.rope_freq_scale_swa,
                                   model.rope_freqs if c.rope_factors_swa else None,
                                   yarn_ramp(c, c.rope_freq_base_swa) if c.yarn_swa else None,
                                   c.rope_mscale if c.yarn_swa else 1.0))
        self.rope_cos = np.ascontiguousarray(np.stack([t[0] for t in tabs]))
        self.rope_sin = np.ascontiguousarray(np.stack([t[1] for t in tabs]))
        self.scale = np.float32(c.kq_scale)
        self.gelu_tab = gelu_table() if any(d.ffn.glu == "gelu" for d in model.layers) else np.zeros(1, f32)
        self.bias = layer_biases(model)
        self._none = np.zeros(0, f32)
        #: the ops of the layer programs, by record kind; each MoE layer's routing record
        self._ops = {Attn: self._attention_block, MLA: self._mla_block, DenseFFN: self._dense_block,
                     MoeFFN: self._moe_block, ShortConv: self._shortconv_block, DeltaNet: self._delta_net_block}
        self._routing = [routing_record(d.ffn.routing if d.moe else None) for d in model.layers]
        #: the recurrent layers' state (quantkit.model.layer, "Recurrent ops"): one float32 row per layer of
        #: the widest layer's state_size, zeros at a sequence's first position; the decode step updates
        #: the same array
        self.state = np.zeros((c.n_layer, max(d.state_size for d in model.layers)), f32)
        self.recurrent = self.state.shape[1] > 0
        self.step: DecodeStep | None = None
        if compiled_step and default_variant() != "plain":
            try:
                self.step = DecodeStep(model, kv16)
            except ModelError:
                self.step = None    # e.g. more distinct matrix types than the step's slots
        self._scores = np.zeros((c.n_head, n_ctx), f32) if self.step is not None else None
        # the matrices the batch path reads: the decode step's huge-page copy when it made one (then
        # the file's pages are dropped from this process: one resident copy of the weights, not two)
        self.token_embd, self.output, self.blk = model.token_embd, model.output, model.blk
        if self.step is not None and self.step.copied:
            self._use_copy(self.step.views)

    def _use_copy(self, views: dict[str, np.ndarray]) -> None:
        m = self.model

        def moved(w: Weight) -> Weight:
            return dataclasses.replace(w, data=views[w.name]) if w.name in views else w

        self.token_embd, self.output = moved(m.token_embd), moved(m.output)
        self.blk = []
        for b in m.blk:
            nb = copy.copy(b)
            for name in STEP_MATS:
                if getattr(b, name) is not None:
                    setattr(nb, name, moved(getattr(b, name)))
            self.blk.append(nb)
        for name in views:
            if m.gguf.has_tensor(name):
                m.gguf.release(m.gguf.tensor(name))

    def reset(self) -> None:
        """llama_memory_clear: forget every position (the cache is never read past ``n_past``) and zero the
        recurrent layers' state."""
        self.n_past = 0
        self.state[...] = 0.0

    def save_prefix(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A copy of the first ``n`` positions of every layer's K and V, and of the recurrent state
        (llama_state_seq_get_data): ``n`` must then be every cached position (a state is that of the last)."""
        if self.recurrent and n != self.n_past:
            raise ModelError(f"save_prefix: the recurrent state is that of position {self.n_past}, not {n}")
        return self.key_cache[:, :n].copy(), self.value_cache[:, :n].copy(), self.state.copy()

    def restore_prefix(self, k: np.ndarray, v: np.ndarray, state: np.ndarray | None = None) -> None:
        """Put a prefix from ``save_prefix`` back and continue after it (llama_state_seq_set_data)."""
        n = k.shape[1]
        self.key_cache[:, :n] = k
        self.value_cache[:, :n] = v
        if state is not None:
            self.state[...] = state
        elif self.recurrent:
            raise ModelError("restore_prefix: the recurrent state is missing")
        self.n_past = n

    def _mm(self, w: Weight, x: np.ndarray, out: np.ndarray, rounded: dict | None = None) -> np.ndarray:
        """out = x @ w^T; products of one x share ``rounded`` (its activation forms, made once)."""
        if self.collect is not None and x.shape[0] >= COLLECT_MIN_ROWS:
            self.collect(w.name, x)
        return matmul(w.data, w.type, x, out, rounded)

    def forward(self, tokens, pos0: int | None = None, logits: str | np.ndarray = "last") -> np.ndarray:
        """Logits float32 (n_rows, n_vocab) for ``tokens`` at positions pos0.. (default: after the
        cache's contents). ``logits``: "last", "all", "none" or indices into ``tokens``."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.size
        pos0 = self.n_past if pos0 is None else int(pos0)
        if n == 0:
            raise ModelError("forward: no tokens")
        if pos0 < 0 or pos0 > self.n_past:
            raise ModelError(f"forward: position {pos0} leaves a gap after the {self.n_past} cached positions")
        if pos0 + n > self.n_ctx:
            raise ModelError(f"forward: positions {pos0}..{pos0 + n - 1} do not fit the context of {self.n_ctx}")
        if self.recurrent and 0 < pos0 < self.n_past:
            # llama_memory_recurrent::seq_rm refuses a partial removal: a state is that of its last position
            raise ModelError(f"forward: a recurrent model cannot go back to position {pos0} (its state is that "
                             f"of position {self.n_past}); start again at 0")
        if pos0 == 0:
            self.state[...] = 0.0       # a new sequence (quantkit.model.layer, "Recurrent ops")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= c.n_vocab:
            raise ModelError(f"forward: token id {lo if lo < 0 else hi} is outside the vocabulary [0, {c.n_vocab})")
        if isinstance(logits, str):
            rows = {"last": np.array([n - 1]), "all": np.arange(n), "none": np.zeros(0, np.int64)}.get(logits)
            if rows is None:
                raise ModelError(f"forward: logits must be 'last', 'all', 'none' or indices, got {logits!r}")
        else:
            rows = np.asarray(logits, dtype=np.int64).reshape(-1)
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise ModelError(f"forward: logits rows must be in [0, {n})")
        if n <= self.n_batch and not (n == 1 and self.step is not None):
            # one pass: its logits are the result (no second (rows, n_vocab) array, no copy)
            ctx = blas_limit() if n >= BLAS_ATTENTION_MIN_TOKENS else contextlib.nullcontext()
            with ctx:
                part = self._step(tokens, pos0, rows)
            return part if part is not None else np.empty((0, c.n_vocab), np.float32)
        out = np.empty((rows.size, c.n_vocab), np.float32)
        if n == 1 and self.step is not None:
            # one compiled call for the whole token (every requested row is row 0)
            part = out[0] if rows.size == 1 else np.empty(c.n_vocab, np.float32)
            self.step.run(int(tokens[0]), pos0, self._kc, self._vc, self.state, self.rope_cos, self.rope_sin,
                          self._scores, part, rows.size > 0)
            self.n_past = pos0 + 1
            if rows.size:
                self._finish_logits(part)
            if rows.size > 1:
                out[:] = part
            return out
        for b0 in range(0, n, self.n_batch):
            b1 = min(n, b0 + self.n_batch)
            sel = (rows >= b0) & (rows < b1)
            if b1 - b0 >= BLAS_ATTENTION_MIN_TOKENS:
                with blas_limit():
                    part = self._step(tokens[b0:b1], pos0 + b0, rows[sel] - b0)
            else:
                part = self._step(tokens[b0:b1], pos0 + b0, rows[sel] - b0)
            if part is not None:
                out[sel] = part
        return out

    def _finish_logits(self, logits: np.ndarray) -> np.ndarray:
        """After the output product, in place: + output.bias (qwen2), / logit_scale (Granite), final logit
        soft-capping (gemma3)."""
        m, c = self.model, self.config
        if m.output_bias is not None:
            logits += m.output_bias
        if c.logit_scale:   # ggml_scale by 1 / logit_scale (Granite)
            logits *= np.float32(1.0) / np.float32(c.logit_scale)
        if c.softcap:
            cap = np.float32(c.softcap)
            np.multiply(np.tanh(logits * (np.float32(1.0) / cap)), cap, out=logits)
        return logits

    def _attend_blas(self, q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int, n_swa: int,
                     sinks: np.ndarray, softcap: np.float32, out: np.ndarray, n_head_kv: int, hd: int,
                     dv: int) -> None:
        """Causal GQA attention as matrix products: q (n, n_head * hd), keys at column kvh * hd of kc,
        values at column kvh * dv of vc, out (n, n_head * dv) (MLA: one kv head over the latent, vc = kc).
        Per KV head, the G query heads that share it are
        stacked as rows (token, head) -- one GEMM of G * block rows against the keys the block's last
        query sees, a masked softmax, one GEMM with V -- over blocks of ATTN_BLOCK queries.

        The KV heads are shared out among numba's thread count of Python threads, each running its
        heads' products on one-thread BLAS: with OpenBLAS's own threads on these small products
        (64-128 wide) its barriers cost more than the work whenever the OS deschedules one thread
        (2-thread profile under load: 4.0-4.2 CPU s of attention per 512-token pass against 0.31 s on
        one thread). Each head is computed the same way whatever the thread count. With fewer KV heads
        than threads (MLA: one), the blocks of queries are shared out instead."""
        n = q.shape[0]
        HKV = n_head_kv
        G = q.shape[1] // hd // HKV
        n_kv = pos0 + n

        def operands(h: int) -> tuple:
            # (n_kv, hd) column slices: float32 ones go to BLAS as they are (leading dimension n_kv*...)
            return (kc[:n_kv, h * hd:(h + 1) * hd].astype(np.float32, copy=False),
                    vc[:n_kv, h * dv:(h + 1) * dv].astype(np.float32, copy=False),
                    np.ascontiguousarray(q[:, h * G * hd:(h + 1) * G * hd]).reshape(n * G, hd))   # rows (t, g)

        def block(h: int, t0: int, K: np.ndarray, V: np.ndarray, Qh: np.ndarray) -> None:
            t1 = min(n, t0 + ATTN_BLOCK)
            nk = pos0 + t1
            S = Qh[t0 * G:t1 * G] @ K[:nk].T                                              # (bt * G, nk)
            causal_softmax_serial(S, pos0 + t0, G, self.scale, softcap, n_swa, sinks[h * G:(h + 1) * G])
            out[t0:t1, h * G * dv:(h + 1) * G * dv] = (S @ V[:nk]).reshape(t1 - t0, G * dv)

        def head(h: int) -> None:
            ops = operands(h)
            for t0 in range(0, n, ATTN_BLOCK):
                block(h, t0, *ops)

        threads = get_threads()
        with blas_one_thread():
            if threads <= 1:
                for h in range(HKV):
                    head(h)
            elif HKV >= threads:
                for f in [_head_pool(threads).submit(head, h) for h in range(HKV)]:
                    f.result()
            else:
                ops = [operands(h) for h in range(HKV)]
                jobs = [_head_pool(threads).submit(block, h, t0, *ops[h]) for h in range(HKV)
                        for t0 in range(0, n, ATTN_BLOCK)]
                for f in jobs:
                    f.result()

    def _step(self, tokens: np.ndarray, pos0: int, rows: np.ndarray) -> np.ndarray | None:
        """One pass of up to n_batch tokens; returns the logits of ``rows`` (None when there are none)."""
        m, c = self.model, self.config
        n = tokens.size
        x = self.x[:n]
        eps = np.float32(c.rms_eps)
        self.embed(tokens, x)
        for i in range(len(m.layers)):
            self.run_layer(i, x, pos0)
        self.n_past = pos0 + n
        if not rows.size:
            return None
        h = np.empty((rows.size, c.n_embd), np.float32)
        rmsnorm(np.ascontiguousarray(x[rows]), m.output_norm, eps, h)                # (rows, n_embd)
        out = self._mm(self.output, h, np.empty((rows.size, c.n_vocab), np.float32))  # (rows, n_vocab)
        return self._finish_logits(out)

    def embed(self, tokens: np.ndarray, x: np.ndarray) -> None:
        """x (n, n_embd) = the embeddings of ``tokens`` (n,), scaled as the architecture says."""
        x[...] = get_rows(self.token_embd.data, self.token_embd.type, tokens)  # (n, n_embd)
        if self.config.embd_scale != 1.0:
            x *= np.float32(self.config.embd_scale)

    def run_layer(self, i: int, x: np.ndarray, pos0: int) -> None:
        """Layer i on x (n <= n_batch rows at positions pos0.., the residual stream, updated in place);
        its keys and values go to layer i's cache."""
        n = x.shape[0]
        xb, xb2, b = self.xb[:n], self.xb2[:n], self.blk[i]
        eps = np.float32(self.config.rms_eps)
        for blk in self.model.layers[i].blocks:  # the layer program (quantkit.model.layer): norm, op, post-norm, add
            if blk.norm:
                rmsnorm(x, getattr(b, blk.norm), eps, xb)
            else:
                xb[...] = x
            self._ops[type(blk.op)](blk.op, i, b, xb, pos0, xb2)
            if blk.post_norm:
                rmsnorm(xb2, getattr(b, blk.post_norm), eps, xb2)
            if blk.scale:
                xb2 *= np.float32(blk.scale)
            x += xb2

    # -- the ops of a layer program: op(record, layer index, the layer's tensors, normed input xb (n, n_embd),
    # first position, out (n, n_embd)) -> out = the block's output before its post-norm and the add

    def _attention_block(self, d: Attn, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """Layer i's attention at positions pos0..: project, (bias, q/k norm,) rotate, cache, attend,
        project back."""
        c = self.config
        n = xb.shape[0]
        q, k, v, att = self.q[:n], self.k[:n], self.v[:n], self.att[:n]
        kc, vc = self._kc[i], self._vc[i]
        eps, none = np.float32(c.rms_eps), self._none
        shared: dict = {}
        if d.gate:      # each head's query rows, then its gate's: the queries into q
            qg = self._mm(b.attn_q, xb, self.qg[:n], shared).reshape(n, c.n_head, 2, c.head_dim)
            q[:] = qg[:, :, 0].reshape(n, -1)
        else:
            self._mm(b.attn_q, xb, q, shared)                             # (n, n_head*head_dim)
        self._mm(b.attn_k, xb, k, shared)                                 # (n, n_head_kv*head_dim)
        self._mm(b.attn_v, xb, v, shared)
        Q, KV = q.shape[1], k.shape[1]
        bias = self.bias[i]
        has_b = d.qkv_bias and bias.size > 0
        self._prepare_store(q, k, v, kc, vc, pos0, self.rope_cos[d.rope_table], self.rope_sin[d.rope_table],
                            bias[:Q] if has_b else none, bias[Q:Q + KV] if has_b else none,
                            bias[Q + KV:] if has_b else none,
                            b.attn_q_norm if d.qk_norm else none, b.attn_k_norm if d.qk_norm else none,
                            d.qk_norm_full, eps, c.n_head, c.n_head_kv, c.head_dim, c.n_rot if d.rope else 0,
                            d.rope_neox, d.l2_norm, d.temp_floor, np.float32(d.temp_scale), np.float32(d.temp_offset))
        sinks = b.attn_sinks if d.sinks else none
        self._attend(q, i, False, pos0, d.window, sinks, np.float32(d.softcap), c.n_head_kv, c.head_dim, c.head_dim,
                     att)
        if d.gate:      # qwen3next's build_layer_attn: the output times sigmoid(gate) (ggml_sigmoid)
            with np.errstate(over="ignore"):        # (a gate below -88: exp overflows, the output is 0)
                att *= 1.0 / (1.0 + np.exp(-qg[:, :, 1].reshape(n, -1)))
        self._mm(b.attn_output, att, out)                                 # (n, n_embd)
        if d.out_bias:
            out += b.attn_output_bias

    def _attend(self, q: np.ndarray, i: int, latent: bool, pos0: int, n_swa: int, sinks: np.ndarray,
                softcap: np.float32, n_head_kv: int, hd: int, dv: int, out: np.ndarray) -> None:
        """Layer i's causal attention of q (n, n_head * hd) over its cache into out (n, n_head * dv): BLAS
        products from BLAS_ATTENTION_MIN_TOKENS rows, else per (token, head) -- the decode step's
        ``attend_head``. ``latent``: an MLA layer's, whose values are its K rows' first dv columns."""
        kc, vc = self.key_cache[i], self.key_cache[i] if latent else self.value_cache[i]
        if q.shape[0] >= BLAS_ATTENTION_MIN_TOKENS:
            self._attend_blas(q, kc, vc, pos0, n_swa, sinks, softcap, out, n_head_kv, hd, dv)
        else:
            attend = self._attn_parallel if q.shape[0] >= PARALLEL_ATTENTION_MIN_TOKENS else self._attn_serial
            attend(q, self._kc[i], self._kc[i] if latent else self._vc[i], pos0, q.shape[1] // hd, n_head_kv, hd,
                   dv, self.scale, softcap, n_swa, sinks, out)

    def _mla_block(self, d: MLA, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """Layer i's multi-head latent attention (quantkit.model.layer.MLA), absorbed as llama.cpp runs it
        for a batch too: q (through its low rank), the latent and k_pe, RoPE and the latent's norm, the
        cache store; per head q_nope @ attn_k_b[h] into the latent's space beside q_pe; one-KV-head
        attention over the cached rows; per head the latent outputs @ attn_v_b[h]; attn_output."""
        c = self.config
        n = xb.shape[0]
        H, nope, R, L = d.n_head, d.n_nope, d.n_rot, d.n_lora_kv
        hk = nope + R
        eps = np.float32(c.rms_eps)
        q = self.q[:n]
        kv = np.empty((n, d.kv_width), np.float32)
        shared: dict = {}
        if d.n_lora_q:
            qa = self._mm(b.attn_q_a, xb, np.empty((n, d.n_lora_q), np.float32), shared)
            rmsnorm(qa, b.attn_q_a_norm, eps, qa)
            self._mm(b.attn_q_b, qa, q)                                  # (n, n_head * hk)
        else:
            self._mm(b.attn_q, xb, q, shared)
        self._mm(b.attn_kv_a_mqa, xb, kv, shared)                         # (n, L + R)
        self._mla_prepare_store(q, kv, self._kc[i], pos0, self.rope_cos[d.rope_table], self.rope_sin[d.rope_table],
                                b.attn_kv_a_norm, eps, H, nope, R, d.rope_neox)
        # the absorbed queries: per head [attn_k_b[h] @ q_nope, q_pe] against the cache rows [latent, k_pe]
        qabs = np.empty((n, H, L + R), np.float32)
        qh = q.reshape(n, H, hk)
        qabs[:, :, L:] = qh[:, :, nope:]
        self._per_head(b.attn_k_b, qh[:, :, :nope], qabs[:, :, :L])
        lat = np.empty((n, H * L), np.float32)                            # each head's latent output
        self._attend(qabs.reshape(n, H * (L + R)), i, True, pos0, 0, self._none, np.float32(0.0), 1, L + R, L, lat)
        att = np.empty((n, H, d.n_v), np.float32)
        self._per_head(b.attn_v_b, lat.reshape(n, H, L), att)
        self._mm(b.attn_output, att.reshape(n, H * d.n_v), out)           # (n, n_embd)

    def _per_head(self, w: Weight, x: np.ndarray, out: np.ndarray) -> None:
        """out[:, h] = x[:, h] @ w[h]^T for each head h of a 3D per-head weight (ggml_mul_mat with
        attn_k_b / attn_v_b, one matrix per head); x (n, n_head, n_in), out (n, n_head, n_out). Collected
        as llama-imatrix collects a 3D mul_mat (per head, one count), from COLLECT_MIN_ROWS rows."""
        n, H = x.shape[:2]
        if self.collect is not None and n >= COLLECT_MIN_ROWS:
            self.collect(w.name, x.transpose(1, 0, 2))                    # (n_head, n, n_in)
        y = np.empty((n, out.shape[2]), np.float32)
        for h in range(H):
            out[:, h] = matmul(w.expert(h).data, w.type, np.ascontiguousarray(x[:, h]), y)

    def _shortconv_block(self, d: ShortConv, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """Layer i's gated short convolution (quantkit.model.layer.ShortConv) of the batch's rows: in_proj,
        the convolution over the state and the rows (``ops.shortconv``, which leaves the state of the last
        row), out_proj."""
        n, E = xb.shape
        bcx = self._mm(b.shortconv_in_proj, xb, np.empty((n, 3 * E), np.float32))     # (n, 3 E): b, c, x
        y = np.empty((n, E), np.float32)
        shortconv(bcx, b.shortconv_conv, self.state[i, :d.state_size].reshape(d.l_cache - 1, E), y)
        self._mm(b.shortconv_out_proj, y, out)                                        # (n, n_embd)

    def _delta_net_block(self, d: DeltaNet, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """Layer i's gated DeltaNet (quantkit.model.layer.DeltaNet) of the batch's rows: the three input
        products, ``ops.delta_net`` over the state row (convolution, gates, the delta rule token by token
        per head -- llama.cpp's fused op -- and the gated norm), ssm_out."""
        n = xb.shape[0]
        shared: dict = {}
        qkv = self._mm(b.attn_qkv, xb, np.empty((n, d.conv_dim), np.float32), shared)
        z = self._mm(b.attn_gate, xb, np.empty((n, d.value_dim), np.float32), shared)
        ba = self._mm(b.ssm_ba, xb, np.empty((n, 2 * d.n_v_heads), np.float32), shared)
        y = np.empty((n, d.value_dim), np.float32)
        delta_net(qkv, z, ba, b.ssm_conv1d, b.ssm_dt_bias, b.ssm_a, b.ssm_norm, np.float32(self.config.rms_eps),
                  d.n_k_heads, self.state[i], y)
        self._mm(b.ssm_out, y, out)                                       # (n, n_embd)

    def _dense_block(self, f: DenseFFN, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """A dense GLU: gate / up, the GLU, down."""
        n = xb.shape[0]
        gate, up = self.gate[:n], self.up[:n]
        shared: dict = {}
        self._mm(b.ffn_gate, xb, gate, shared)                            # (n, n_ff)
        self._mm(b.ffn_up, xb, up, shared)
        glu_rows(gate, up, GLU_KINDS.index(f.glu), self.gelu_tab)
        self._mm(b.ffn_down, gate, out)                                   # (n, n_embd)

    def _moe_block(self, f: MoeFFN, i: int, b: Block, xb: np.ndarray, pos0: int, out: np.ndarray) -> None:
        """build_moe_ffn over the batch: route every token, then each chosen expert once over the rows
        of the tokens that chose it (mul_mat_id's grouping), reading only that expert's slice of the
        mapped 3D tensors; out[t] = the sum over t's slots, in selection order, of weight * expert."""
        n, E = xb.shape
        logits = self._mm(b.ffn_gate_inp, xb, np.empty((n, f.n_expert), np.float32))   # (n, n_expert)
        if f.biases:
            logits += b.ffn_gate_inp_bias
        top, w = route_rows(logits, self._routing[i], b.exp_probs_b)                  # (n, n_used)
        slots = np.empty((f.n_expert_used, n, E), np.float32)    # each token's weighted expert outputs
        kind = GLU_KINDS.index(f.glu)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            xe = np.ascontiguousarray(xb[rows])                                       # (m, n_embd)
            if f.weight_before:   # build_moe_ffn's weight_before_ffn: the weight on the expert's input
                xe *= w[rows, slot][:, None]
            m = rows.size
            gate, up = np.empty((m, f.n_ff), np.float32), np.empty((m, f.n_ff), np.float32)
            shared: dict = {}
            if f.gate_up:  # one product for the gate and up rows of ffn_gate_up_exps
                w_gu = b.ffn_gate_up_exps
                if self.collect is not None:
                    self.collect(w_gu.name, xe, (int(e), f.n_expert))
                gu = matmul(w_gu.expert(e).data, w_gu.type, xe, np.empty((m, 2 * f.n_ff), np.float32), shared)
                gate[...], up[...] = gu[:, :f.n_ff], gu[:, f.n_ff:]
            else:
                if self.collect is not None:   # mul_mat_id: collected per expert whatever the row count
                    self.collect(b.ffn_gate_exps.name, xe, (int(e), f.n_expert))
                    self.collect(b.ffn_up_exps.name, xe, (int(e), f.n_expert))
                matmul(b.ffn_gate_exps.expert(e).data, b.ffn_gate_exps.type, xe, gate, shared)
                matmul(b.ffn_up_exps.expert(e).data, b.ffn_up_exps.type, xe, up, shared)
            if f.biases:   # ggml_add_id: each expert's bias row after its products
                gate += b.ffn_gate_exps_bias[e]
                up += b.ffn_up_exps_bias[e]
            glu_rows(gate, up, kind, self.gelu_tab)
            if self.collect is not None:
                self.collect(b.ffn_down_exps.name, gate, (int(e), f.n_expert))
            y = matmul(b.ffn_down_exps.expert(e).data, b.ffn_down_exps.type, gate, np.empty((m, E), np.float32))
            if f.biases:
                y += b.ffn_down_exps_bias[e]
            slots[slot, rows] = y if f.weight_before else y * w[rows, slot][:, None]
        out[...] = slots[0]
        for j in range(1, f.n_expert_used):
            out += slots[j]
        if f.n_ff_shexp:
            # the shared expert: a dense GLU over every row (qwen2moe: times sigmoid of its gate), added
            # after the routed experts
            gate, up = np.empty((n, f.n_ff_shexp), np.float32), np.empty((n, f.n_ff_shexp), np.float32)
            shared = {}
            self._mm(b.ffn_gate_shexp, xb, gate, shared)
            self._mm(b.ffn_up_shexp, xb, up, shared)
            glu_rows(gate, up, kind, self.gelu_tab)
            y = self._mm(b.ffn_down_shexp, gate, np.empty((n, E), np.float32))
            if f.shexp_gate:
                g = self._mm(b.ffn_gate_inp_shexp, xb, np.empty((n, 1), np.float32))      # (n, 1)
                with np.errstate(over="ignore"):    # exp(-g) -> inf for g < -88: the gate is 0, as ggml's
                    y *= np.float32(1.0) / (np.float32(1.0) + np.exp(-g, dtype=np.float32))
            out += y
