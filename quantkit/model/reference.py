"""A float64 numpy forward pass on dequantized weights: simple and obviously right, for the tests.

No KV cache, no batching tricks: every call runs the whole token sequence from position 0 and returns
the logits of every position. Weights are dequantized one matrix at a time as they are used, so even
the bundled model fits in memory (never more than one float64 matrix alive; one expert's at a time).
Each layer is its ``quantkit.model.layer.Layer`` program, walked block by block (``_attention``, ``_mla``,
``_delta_net``, ``_dense``, ``_moe``), as the batch path and the decode step walk it. A DeltaNet layer runs
its recurrence token by token from a zero state (the chunked form llama.cpp's graph may use is the same sum).
"""

from __future__ import annotations

import numpy as np

from quantkit.model.layer import MLA, Attn, DeltaNet, DenseFFN, MoeFFN, ShortConv
from quantkit.model.llama import Block, Llama, Weight, yarn_ramp
from quantkit.model.route import route


def _w(weight: Weight) -> np.ndarray:
    return weight.dequantize().astype(np.float64)       # (n_out, n_in)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def _rope(x: np.ndarray, n_heads: int, head_dim: int, n_rot: int, base: float, freq_scale: float,
          freq_factors: np.ndarray | None, ramp: np.ndarray | None = None, mscale: float = 1.0,
          neox: bool = False) -> np.ndarray:
    """Rotate each head's first n_rot dims, pair i by p * base^(-2i/n_rot) (divided by its frequency
    factor) times freq_scale -- with YaRN (``ramp``, llama.yarn_ramp) that interpolated angle mixed with
    the unscaled one by ramp[i], and cos / sin times ``mscale``: NORM pairs (x[2i], x[2i+1]), NEOX pairs
    (x[i], x[i + n_rot/2])."""
    n = x.shape[0]
    x = x.reshape(n, n_heads, head_dim).copy()
    i = np.arange(n_rot // 2)
    inv = base ** (-2.0 * i / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    inv = inv * freq_scale if ramp is None else inv * (freq_scale * (1.0 - ramp) + ramp)
    theta = np.arange(n)[:, None] * inv[None, :]                   # (n, n_rot/2)
    cos, sin = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]
    a, b = (slice(0, n_rot // 2), slice(n_rot // 2, n_rot)) if neox else \
        (slice(0, n_rot, 2), slice(1, n_rot, 2))
    x0, x1 = x[:, :, a].copy(), x[:, :, b].copy()
    x[:, :, a] = x0 * cos - x1 * sin
    x[:, :, b] = x0 * sin + x1 * cos
    return x.reshape(n, n_heads * head_dim)


def _head_norm(x: np.ndarray, n_heads: int, head_dim: int, w: np.ndarray, eps: float) -> np.ndarray:
    n = x.shape[0]
    return _rmsnorm(x.reshape(n, n_heads, head_dim), w, eps).reshape(n, n_heads * head_dim)


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu_f32), in float64."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _act(glu: str):
    return _gelu if glu == "gelu" else _silu


def _glu(g: np.ndarray, u: np.ndarray, glu: str) -> np.ndarray:
    """act(g) * u; "swiglu_oai": ggml_swiglu_oai (alpha 1.702, limit 7): g clamped above at 7, u to
    [-7, 7], g * sigmoid(1.702 g) * (u + 1)."""
    if glu == "swiglu_oai":
        g = np.minimum(g, 7.0)
        return g / (1.0 + np.exp(-1.702 * g)) * (np.clip(u, -7.0, 7.0) + 1.0)
    return _act(glu)(g) * u


def _glu_ffn(h: np.ndarray, gate: Weight | np.ndarray, up: Weight | np.ndarray, down: Weight, glu: str,
             biases=None) -> np.ndarray:
    """The GLU FFN of h (gate and up Weights or float64 matrices); ``biases``: (gate, up, down) bias vectors
    added after each product (gpt-oss)."""
    g, u = (h @ (m if isinstance(m, np.ndarray) else _w(m)).T for m in (gate, up))
    if biases is not None:
        g, u = g + biases[0], u + biases[1]
    y = _glu(g, u, glu) @ _w(down).T
    return y if biases is None else y + biases[2]


# -- the ops of a layer program (quantkit.model.layer): op(record, layer's tensors, normed input h (n, n_embd),
# config, RoPE tables, routes) -> the block's output before its post-norm and the residual add

def _dense(f: DenseFFN, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    return _glu_ffn(h, b.ffn_gate, b.ffn_up, b.ffn_down, f.glu)


def _moe(f: MoeFFN, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    """build_moe_ffn; each layer's ``route`` (experts, weights, margins)
    appended to ``routes`` when given."""
    logits = h @ _w(b.ffn_gate_inp).T
    if f.biases:
        logits = logits + b.ffn_gate_inp_bias
    top, w, margin = route(logits, f.routing, b.exp_probs_b)
    if routes is not None:
        routes.append((top, w, margin))
    out = np.zeros_like(h)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        bias = (b.ffn_gate_exps_bias[e], b.ffn_up_exps_bias[e], b.ffn_down_exps_bias[e]) if f.biases else None
        if f.gate_up:   # ffn_gate_up_exps: the expert's gate rows, then its up rows
            gu = _w(b.ffn_gate_up_exps.expert(e))
            gate, up = gu[:f.n_ff], gu[f.n_ff:]
        else:
            gate, up = b.ffn_gate_exps.expert(e), b.ffn_up_exps.expert(e)
        if f.weight_before:     # build_moe_ffn's weight_before_ffn: the weight on the expert's input
            out[rows] += _glu_ffn(h[rows] * w[rows, slot][:, None], gate, up, b.ffn_down_exps.expert(e), f.glu, bias)
            continue
        y = _glu_ffn(h[rows], gate, up, b.ffn_down_exps.expert(e), f.glu, bias)
        out[rows] += w[rows, slot][:, None] * y
    if f.n_ff_shexp:
        y = _glu_ffn(h, b.ffn_gate_shexp, b.ffn_up_shexp, b.ffn_down_shexp, f.glu)
        out += 1.0 / (1.0 + np.exp(-(h @ _w(b.ffn_gate_inp_shexp).T))) * y if f.shexp_gate else y
    return out


def _attention(d: Attn, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    """Attention over positions 0..n-1; ``ropes``: per RoPE table, (base, freq_scale, freq_factors,
    YaRN ramp, mscale)."""
    rope = ropes[d.rope_table]
    n, hd = h.shape[0], c.head_dim
    pos = np.arange(n)
    group = c.n_head // c.n_head_kv
    mask = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0)                  # causal
    if d.n_swa and d.chunked:   # LLAMA_SWA_TYPE_CHUNKED: a key before its query's chunk
        mask[pos[None, :] < (pos[:, None] // d.n_swa) * d.n_swa] = -np.inf
    elif d.n_swa:
        mask[pos[:, None] - pos[None, :] >= d.n_swa] = -np.inf                  # sliding window
    q, k, v = h @ _w(b.attn_q).T, h @ _w(b.attn_k).T, h @ _w(b.attn_v).T
    if d.gate:      # each head's rows: its query, then its output gate
        q, gate = (x.reshape(n, c.n_head * hd) for x in np.split(q.reshape(n, c.n_head, 2 * hd), 2, axis=2))
    if d.qkv_bias:
        for name, t in (("attn_q_bias", q), ("attn_k_bias", k), ("attn_v_bias", v)):
            if getattr(b, name) is not None:
                t += getattr(b, name)
    if d.qk_norm and d.qk_norm_full:    # one norm over the whole projection (OLMo 2)
        q, k = _rmsnorm(q, b.attn_q_norm, c.rms_eps), _rmsnorm(k, b.attn_k_norm, c.rms_eps)
    elif d.qk_norm:
        q = _head_norm(q, c.n_head, hd, b.attn_q_norm, c.rms_eps)
        k = _head_norm(k, c.n_head_kv, hd, b.attn_k_norm, c.rms_eps)
    if d.rope:
        q = _rope(q, c.n_head, hd, c.n_rot, *rope, neox=d.rope_neox)
        k = _rope(k, c.n_head_kv, hd, c.n_rot, *rope, neox=d.rope_neox)
    if d.temp_floor:    # llm_graph_input_attn_temp: q times its position's temperature
        q = q * (np.log(np.floor((pos + d.temp_offset) / d.temp_floor) + 1.0) * d.temp_scale + 1.0)[:, None]
    if d.l2_norm:       # ggml_rms_norm per head, no weight, after RoPE
        one = np.ones(1)
        q, k = _head_norm(q, c.n_head, hd, one, c.rms_eps), _head_norm(k, c.n_head_kv, hd, one, c.rms_eps)
    q = q.reshape(n, c.n_head, hd).transpose(1, 0, 2)                   # (n_head, n, hd)
    k = np.repeat(k.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    v = np.repeat(v.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    s = q @ k.transpose(0, 2, 1) * c.kq_scale                           # (n_head, n, n)
    if d.softcap:       # llama-graph.cpp build_attn_mha: attn_soft_cap (ggml_flash_attn_ext's logit_softcap)
        s = d.softcap * np.tanh(s / d.softcap)
    s = s + mask
    mx = s.max(axis=-1, keepdims=True)
    if d.sinks:     # ggml_soft_max_add_sinks: head h's sink logit joins the max and the denominator
        sink = b.attn_sinks.astype(np.float64)[:, None, None]
        mx = np.maximum(mx, sink)
    p = np.exp(s - mx)
    p /= p.sum(axis=-1, keepdims=True) + (np.exp(sink - mx) if d.sinks else 0.0)
    o = (p @ v).transpose(1, 0, 2).reshape(n, c.n_head * hd)
    if d.gate:
        o = o / (1.0 + np.exp(-gate))
    o = o @ _w(b.attn_output).T
    return o + b.attn_output_bias if d.out_bias else o


def _softmax_causal(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of scores (..., n, n) with the causal mask."""
    n = s.shape[-1]
    s = s + np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -np.inf, 0.0)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _mla(d: MLA, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    """Multi-head latent attention in its decompressed form (the batch path and the decode step run the
    absorbed one; quantkit.model.layer.MLA): each head's keys [attn_k_b[h]^T c_t, k_pe_t] and values
    attn_v_b[h] c_t from the normed latent c_t of every position, then softmax attention as any MHA."""
    n = h.shape[0]
    H, nope, R, L = d.n_head, d.n_nope, d.n_rot, d.n_lora_kv
    if d.n_lora_q:
        q = _rmsnorm(h @ _w(b.attn_q_a).T, b.attn_q_a_norm, c.rms_eps) @ _w(b.attn_q_b).T
    else:
        q = h @ _w(b.attn_q).T
    q = q.reshape(n, H, nope + R)
    q_pe = _rope(q[:, :, nope:].reshape(n, H * R), H, R, R, *ropes[d.rope_table], neox=d.rope_neox).reshape(n, H, R)
    kv = h @ _w(b.attn_kv_a_mqa).T                                     # (n, L + R)
    lat = _rmsnorm(kv[:, :L], b.attn_kv_a_norm, c.rms_eps)             # (n, L)
    k_pe = _rope(kv[:, L:], 1, R, R, *ropes[d.rope_table], neox=d.rope_neox)   # (n, R), shared by the heads
    k_nope = np.einsum("tl,hln->htn", lat, _w(b.attn_k_b).reshape(H, L, nope))   # (H, n, nope)
    v = np.einsum("tl,hvl->htv", lat, _w(b.attn_v_b).reshape(H, d.n_v, L))      # (H, n, n_v)
    s = np.einsum("thn,hsn->hts", q[:, :, :nope], k_nope) + np.einsum("thr,sr->hts", q_pe, k_pe)
    p = _softmax_causal(s * c.kq_scale)
    return np.einsum("hts,hsv->thv", p, v).reshape(n, H * d.n_v) @ _w(b.attn_output).T


def _shortconv(d: ShortConv, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    """LFM2's gated short convolution over positions 0..n-1 (quantkit.model.layer.ShortConv): the state is
    this function's own window, zeros before position 0 -- what the other paths carry between calls."""
    n, E = h.shape
    bcx = h @ _w(b.shortconv_in_proj).T                                 # (n, 3 E): b, c, x
    u = bcx[:, :E] * bcx[:, 2 * E:]
    w = b.shortconv_conv.astype(np.float64)                             # (E, l_cache)
    pad = np.concatenate([np.zeros((d.l_cache - 1, E)), u])             # (l_cache - 1 + n, E)
    conv = sum(pad[k:k + n] * w[:, k] for k in range(d.l_cache))        # causal, per channel
    return (bcx[:, E:2 * E] * conv) @ _w(b.shortconv_out_proj).T


def _delta_net(d: DeltaNet, b: Block, h: np.ndarray, c, ropes: tuple, routes: list | None) -> np.ndarray:
    """Gated DeltaNet over positions 0..n-1 from a zero state (quantkit.model.layer.DeltaNet's formulas),
    the recurrence one token at a time."""
    n, HK, HV, S = h.shape[0], d.n_k_heads, d.n_v_heads, d.head_dim
    x = h @ _w(b.attn_qkv).T                                            # (n, conv_dim)
    z = (h @ _w(b.attn_gate).T).reshape(n, HV, S)
    ba = (h @ _w(b.ssm_ba).T).reshape(n, HK, 2, HV // HK)               # per key-head group: [b, a]
    beta = 1.0 / (1.0 + np.exp(-ba[:, :, 0].reshape(n, HV)))
    a = ba[:, :, 1].reshape(n, HV) + b.ssm_dt_bias
    g = np.logaddexp(0.0, a) * b.ssm_a.astype(np.float64)             # softplus(a + dt_bias) * -exp(A_log)
    w = b.ssm_conv1d.astype(np.float64)                                 # (conv_dim, d_conv)
    xp = np.concatenate([np.zeros((d.d_conv - 1, x.shape[1])), x])     # the zero window before position 0
    conv = sum(xp[i:i + n] * w[:, i] for i in range(d.d_conv))
    conv = conv / (1.0 + np.exp(-conv))                                 # silu
    kd = d.key_dim

    def l2(t):      # build_gdn_l2_norm: t / sqrt(sum t^2 + eps)
        return t / np.sqrt(np.sum(t * t, axis=-1, keepdims=True) + c.rms_eps)

    rep = np.arange(HV) // (HV // HK)                                   # value head j reads key head j // r
    q = l2(conv[:, :kd].reshape(n, HK, S))[:, rep]
    k = l2(conv[:, kd:2 * kd].reshape(n, HK, S))[:, rep]
    v = conv[:, 2 * kd:].reshape(n, HV, S)
    state = np.zeros((HV, S, S))                                        # per value head: S (v x k)
    o = np.empty((n, HV, S))
    for t in range(n):
        state *= np.exp(g[t])[:, None, None]
        delta = (v[t] - np.einsum("hvk,hk->hv", state, k[t])) * beta[t][:, None]
        state += delta[:, :, None] * k[t][:, None, :]
        o[t] = np.einsum("hvk,hk->hv", state, q[t]) / np.sqrt(S)
    o = _rmsnorm(o, b.ssm_norm, c.rms_eps) * _silu(z)
    return o.reshape(n, HV * S) @ _w(b.ssm_out).T


_OPS = {Attn: _attention, MLA: _mla, DenseFFN: _dense, MoeFFN: _moe, ShortConv: _shortconv, DeltaNet: _delta_net}


def reference_logits(model: Llama, tokens, routes: list | None = None) -> np.ndarray:
    """float64 logits (n_tokens, n_vocab) of ``tokens`` at positions 0..n-1: each layer's program
    (quantkit.model.layer), block by block. ``routes``: a list that gets each MoE layer's
    ``route`` (experts, weights, margins), for the tests."""
    c = model.config
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    x = model.token_embd.dequantize()[tokens].astype(np.float64) * c.embd_scale   # (n, n_embd)
    ropes = ((c.rope_freq_base, c.rope_freq_scale, model.rope_freqs, yarn_ramp(c, c.rope_freq_base), c.rope_mscale),
             (c.rope_freq_base_swa, c.rope_freq_scale_swa, model.rope_freqs if c.rope_factors_swa else None,
              yarn_ramp(c, c.rope_freq_base_swa) if c.yarn_swa else None, c.rope_mscale if c.yarn_swa else 1.0))
    for layer, b in zip(model.layers, model.blk):
        for blk in layer.blocks:        # the layer program (quantkit.model.layer)
            h = _rmsnorm(x, getattr(b, blk.norm), c.rms_eps) if blk.norm else x
            y = _OPS[type(blk.op)](blk.op, b, h, c, ropes, routes)
            y = _rmsnorm(y, getattr(b, blk.post_norm), c.rms_eps) if blk.post_norm else y
            x = x + (y * blk.scale if blk.scale else y)
    h = _rmsnorm(x, model.output_norm, c.rms_eps)
    logits = h @ _w(model.output).T                                          # (n, n_vocab)
    if model.output_bias is not None:
        logits = logits + model.output_bias
    if c.logit_scale:
        logits = logits / c.logit_scale
    if c.softcap:
        logits = c.softcap * np.tanh(logits / c.softcap)
    return logits
