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
from quantkit.model.llama import Block, Llama, Weight


def _w(weight: Weight) -> np.ndarray:
    return weight.dequantize().astype(np.float64)       # (n_out, n_in)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def _rope(x: np.ndarray, n_heads: int, head_dim: int, n_rot: int, base: float, freq_scale: float,
          freq_factors: np.ndarray | None, neox: bool = False) -> np.ndarray:
    """Rotate each head's first n_rot dims, pair i by p * base^(-2i/n_rot): NORM pairs (x[2i], x[2i+1]),
    NEOX pairs (x[i], x[i + n_rot/2])."""
    n = x.shape[0]
    x = x.reshape(n, n_heads, head_dim).copy()
    i = np.arange(n_rot // 2)
    inv = base ** (-2.0 * i / n_rot) * freq_scale
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    theta = np.arange(n)[:, None] * inv[None, :]                   # (n, n_rot/2)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
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


def _glu_ffn(h: np.ndarray, gate: Weight, up: Weight, down: Weight, glu: str) -> np.ndarray:
    return (_act(glu)(h @ _w(gate).T) * (h @ _w(up).T)) @ _w(down).T


def route(logits: np.ndarray, f: MoeFFN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """build_moe_ffn's routing in float64: (experts (n, n_used) int64, weights (n, n_used)) from the
    router logits (n, n_expert). Softmax probabilities, the n_used largest with ties to the lower
    index (ggml_argsort_top_k's std::sort is an insertion sort up to 16 elements, which keeps the
    order of equal ones), their probabilities as weights, normalized to sum 1 when norm_w; third, the
    routing's margin per token: the n_used-th probability less the next (0 with all experts used)."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :f.n_expert_used]
    w = np.take_along_axis(p, top, axis=-1)
    if f.norm_w:
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), 6.103515625e-5)
    if f.w_scale not in (0.0, 1.0):
        w = w * f.w_scale
    srt = -np.sort(-p, axis=-1)
    margin = srt[:, f.n_expert_used - 1] - srt[:, f.n_expert_used] if f.n_expert_used < f.n_expert \
        else np.zeros(p.shape[0])
    return top, w, margin


def _ffn(f: DenseFFN | MoeFFN, b: Block, h: np.ndarray, eps: float, routes: list | None = None) -> np.ndarray:
    """The FFN block's output (before the residual add) for the normed input h (n, n_embd)."""
    if isinstance(f, DenseFFN):
        out = _glu_ffn(h, b.ffn_gate, b.ffn_up, b.ffn_down, f.glu)
        return _rmsnorm(out, b.post_ffw_norm, eps) if f.post_norm else out
    top, w, margin = route(h @ _w(b.ffn_gate_inp).T, f)
    if routes is not None:
        routes.append((top, w, margin))
    out = np.zeros_like(h)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        y = _glu_ffn(h[rows], b.ffn_gate_exps.expert(e), b.ffn_up_exps.expert(e), b.ffn_down_exps.expert(e), f.glu)
        out[rows] += w[rows, slot][:, None] * y
    return out


def _attention(d: Attn, c, b: Block, h: np.ndarray, rope: tuple) -> np.ndarray:
    """The attention block's output (before the residual add) for the normed input h (n, n_embd);
    ``rope``: (base, freq_scale, freq_factors) of the layer's table."""
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
    q = _rope(q, c.n_head, hd, c.n_rot, *rope, d.rope_neox)
    k = _rope(k, c.n_head_kv, hd, c.n_rot, *rope, d.rope_neox)
    q = q.reshape(n, c.n_head, hd).transpose(1, 0, 2)                   # (n_head, n, hd)
    k = np.repeat(k.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    v = np.repeat(v.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
    s = q @ k.transpose(0, 2, 1) * c.kq_scale + mask                    # (n_head, n, n)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(1, 0, 2).reshape(n, c.n_head * hd) @ _w(b.attn_output).T
    return _rmsnorm(o, b.post_attention_norm, c.rms_eps) if d.post_norm else o


def reference_logits(model: Llama, tokens, routes: list | None = None) -> np.ndarray:
    """float64 logits (n_tokens, n_vocab) of ``tokens`` at positions 0..n-1: each layer's ``Layer``
    record (quantkit.model.layer), step by step. ``routes``: a list that gets each MoE layer's
    ``route`` (experts, weights, margins), for the tests."""
    c = model.config
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    x = model.token_embd.dequantize()[tokens].astype(np.float64) * c.embd_scale   # (n, n_embd)
    ropes = ((c.rope_freq_base, c.rope_freq_scale, model.rope_freqs), (c.rope_freq_base_swa, 1.0, None))
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
