"""A float64 numpy forward pass on dequantized weights: simple and obviously right, for the tests.

No KV cache, no batching tricks: every call runs the whole token sequence from position 0 and returns
the logits of every position. Weights are dequantized one matrix at a time as they are used, so even
the bundled model fits in memory (never more than one float64 matrix alive; one expert's at a time).
Each layer is its ``quantkit.model.layer.Layer`` record, interpreted step by step (``_attention``,
``_ffn``), as the batch path and the decode step interpret it.
"""

from __future__ import annotations

import numpy as np

from quantkit.model.layer import Attn, DenseFFN, Layer, MoeFFN
from quantkit.model.llama import Block, Llama, Weight, yarn_ramp


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


def _glu_ffn(h: np.ndarray, gate: Weight, up: Weight, down: Weight, glu: str, biases=None) -> np.ndarray:
    """The GLU FFN of h; ``biases``: (gate, up, down) bias vectors added after each product (gpt-oss)."""
    g, u = h @ _w(gate).T, h @ _w(up).T
    if biases is not None:
        g, u = g + biases[0], u + biases[1]
    y = _glu(g, u, glu) @ _w(down).T
    return y if biases is None else y + biases[2]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def route(logits: np.ndarray, f: MoeFFN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """build_moe_ffn's routing in float64: (experts (n, n_used) int64, weights (n, n_used)) from the
    router logits (n, n_expert, the router's bias added). The n_used largest logits, ties to the lower
    index (ggml_argsort_top_k's std::sort is an insertion sort up to 16 elements, which keeps the order
    of equal ones; softmax keeps the order); their weights: gating "softmax", their softmax
    probabilities over all experts; "softmax_weight" (gpt-oss), the softmax of the chosen logits alone;
    normalized to sum 1 when norm_w, times w_scale unless it is 0 or 1. Third, the routing's margin per
    token: the n_used-th largest logit less the next (for softmax gating, the log-probability gap; 0
    with all experts used)."""
    k = f.n_expert_used
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    if f.gating == "softmax":
        w = np.take_along_axis(_softmax(logits), top, axis=-1)
    else:
        w = _softmax(np.take_along_axis(logits, top, axis=-1))
    if f.norm_w:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), 6.103515625e-5)
    if f.w_scale not in (0.0, 1.0):
        w = w * f.w_scale
    srt = -np.sort(-logits, axis=-1)
    margin = srt[:, k - 1] - srt[:, k] if k < f.n_expert else np.zeros(logits.shape[0])
    return top, w, margin


def _ffn(f: DenseFFN | MoeFFN, b: Block, h: np.ndarray, eps: float, routes: list | None = None) -> np.ndarray:
    """The FFN block's output (before the residual add) for the normed input h (n, n_embd)."""
    if isinstance(f, DenseFFN):
        out = _glu_ffn(h, b.ffn_gate, b.ffn_up, b.ffn_down, f.glu)
        return _rmsnorm(out, b.post_ffw_norm, eps) if f.post_norm else out
    logits = h @ _w(b.ffn_gate_inp).T
    if f.biases:
        logits = logits + b.ffn_gate_inp_bias
    top, w, margin = route(logits, f)
    if routes is not None:
        routes.append((top, w, margin))
    out = np.zeros_like(h)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        bias = (b.ffn_gate_exps_bias[e], b.ffn_up_exps_bias[e], b.ffn_down_exps_bias[e]) if f.biases else None
        y = _glu_ffn(h[rows], b.ffn_gate_exps.expert(e), b.ffn_up_exps.expert(e), b.ffn_down_exps.expert(e), f.glu,
                     bias)
        out[rows] += w[rows, slot][:, None] * y
    if f.n_ff_shexp:
        g = h @ _w(b.ffn_gate_inp_shexp).T                                   # (n, 1)
        out += 1.0 / (1.0 + np.exp(-g)) * _glu_ffn(h, b.ffn_gate_shexp, b.ffn_up_shexp, b.ffn_down_shexp, f.glu)
    return out


def _attention(d: Attn, c, b: Block, h: np.ndarray, rope: tuple) -> np.ndarray:
    """The attention block's output (before the residual add) for the normed input h (n, n_embd);
    ``rope``: (base, freq_scale, freq_factors, YaRN ramp, mscale) of the layer's table."""
    n, hd = h.shape[0], c.head_dim
    pos = np.arange(n)
    group = c.n_head // c.n_head_kv
    mask = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0)                  # causal
    if d.n_swa:
        mask[pos[:, None] - pos[None, :] >= d.n_swa] = -np.inf                  # sliding window
    q, k, v = h @ _w(b.attn_q).T, h @ _w(b.attn_k).T, h @ _w(b.attn_v).T
    if d.qkv_bias:
        for name, t in (("attn_q_bias", q), ("attn_k_bias", k), ("attn_v_bias", v)):
            if getattr(b, name) is not None:
                t += getattr(b, name)
    if d.qk_norm:
        q = _head_norm(q, c.n_head, hd, b.attn_q_norm, c.rms_eps)
        k = _head_norm(k, c.n_head_kv, hd, b.attn_k_norm, c.rms_eps)
    q = _rope(q, c.n_head, hd, c.n_rot, *rope, neox=d.rope_neox)
    k = _rope(k, c.n_head_kv, hd, c.n_rot, *rope, neox=d.rope_neox)
    q = q.reshape(n, c.n_head, hd).transpose(1, 0, 2)                   # (n_head, n, hd)
    k = np.repeat(k.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    v = np.repeat(v.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    s = q @ k.transpose(0, 2, 1) * c.kq_scale + mask                    # (n_head, n, n)
    mx = s.max(axis=-1, keepdims=True)
    if d.sinks:     # ggml_soft_max_add_sinks: head h's sink logit joins the max and the denominator
        sink = b.attn_sinks.astype(np.float64)[:, None, None]
        mx = np.maximum(mx, sink)
    p = np.exp(s - mx)
    p /= p.sum(axis=-1, keepdims=True) + (np.exp(sink - mx) if d.sinks else 0.0)
    o = (p @ v).transpose(1, 0, 2).reshape(n, c.n_head * hd) @ _w(b.attn_output).T
    if d.out_bias:
        o = o + b.attn_output_bias
    return _rmsnorm(o, b.post_attention_norm, c.rms_eps) if d.post_norm else o


def reference_logits(model: Llama, tokens, routes: list | None = None) -> np.ndarray:
    """float64 logits (n_tokens, n_vocab) of ``tokens`` at positions 0..n-1: each layer's ``Layer``
    record (quantkit.model.layer), step by step. ``routes``: a list that gets each MoE layer's
    ``route`` (experts, weights, margins), for the tests."""
    c = model.config
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    x = model.token_embd.dequantize()[tokens].astype(np.float64) * c.embd_scale   # (n, n_embd)
    ropes = ((c.rope_freq_base, c.rope_freq_scale, model.rope_freqs, yarn_ramp(c, c.rope_freq_base), c.rope_mscale),
             (c.rope_freq_base_swa, c.rope_freq_scale_swa, None, yarn_ramp(c, c.rope_freq_base_swa), c.rope_mscale))
    for d, b in zip(model.layers, model.blk):
        d: Layer
        x = x + _attention(d.attn, c, b, _rmsnorm(x, b.attn_norm, c.rms_eps), ropes[d.attn.rope_table])
        x = x + _ffn(d.ffn, b, _rmsnorm(x, b.ffn_norm, c.rms_eps), c.rms_eps, routes)
    h = _rmsnorm(x, model.output_norm, c.rms_eps)
    logits = h @ _w(model.output).T                                          # (n, n_vocab)
    if model.output_bias is not None:
        logits = logits + model.output_bias
    if c.softcap:
        logits = c.softcap * np.tanh(logits / c.softcap)
    return logits
