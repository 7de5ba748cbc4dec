"""A float64 numpy forward pass on dequantized weights: simple and obviously right, for the tests.

No KV cache, no batching tricks: every call runs the whole token sequence from position 0 and returns
the logits of every position. Weights are dequantized one matrix at a time as they are used, so even
the bundled model fits in memory (never more than one float64 matrix alive).
"""

from __future__ import annotations

import numpy as np

from quantkit.model.llama import Llama, Weight


def _w(weight: Weight) -> np.ndarray:
    return weight.dequantize().astype(np.float64)       # (n_out, n_in)


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def _rope(x: np.ndarray, n_heads: int, head_dim: int, n_rot: int, base: float, freq_scale: float,
          freq_factors: np.ndarray | None) -> np.ndarray:
    """NORM RoPE: rotate adjacent pairs (x[2i], x[2i+1]) of each head's first n_rot dims by p * base^(-2i/n_rot)."""
    n = x.shape[0]
    x = x.reshape(n, n_heads, head_dim).copy()
    i = np.arange(n_rot // 2)
    inv = base ** (-2.0 * i / n_rot) * freq_scale
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    theta = np.arange(n)[:, None] * inv[None, :]                   # (n, n_rot/2)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[:, :, 0:n_rot:2].copy(), x[:, :, 1:n_rot:2].copy()
    x[:, :, 0:n_rot:2] = x0 * cos - x1 * sin
    x[:, :, 1:n_rot:2] = x0 * sin + x1 * cos
    return x.reshape(n, n_heads * head_dim)


def reference_logits(model: Llama, tokens) -> np.ndarray:
    """float64 logits (n_tokens, n_vocab) of ``tokens`` at positions 0..n-1."""
    c = model.config
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n, hd = tokens.size, c.head_dim
    x = model.token_embd.dequantize()[tokens].astype(np.float64)            # (n, n_embd)
    mask = np.triu(np.full((n, n), -np.inf), k=1)                           # causal
    group = c.n_head // c.n_head_kv
    for b in model.blk:
        h = _rmsnorm(x, b.attn_norm, c.rms_eps)
        q = _rope(h @ _w(b.attn_q).T, c.n_head, hd, c.n_rot, c.rope_freq_base, c.rope_freq_scale, model.rope_freqs)
        k = _rope(h @ _w(b.attn_k).T, c.n_head_kv, hd, c.n_rot, c.rope_freq_base, c.rope_freq_scale,
                  model.rope_freqs)
        v = h @ _w(b.attn_v).T
        q = q.reshape(n, c.n_head, hd).transpose(1, 0, 2)                   # (n_head, n, hd)
        k = np.repeat(k.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
        v = np.repeat(v.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask                   # (n_head, n, n)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, c.n_head * hd)
        x = x + o @ _w(b.attn_output).T
        h = _rmsnorm(x, b.ffn_norm, c.rms_eps)
        g = h @ _w(b.ffn_gate).T
        u = h @ _w(b.ffn_up).T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ _w(b.ffn_down).T
    h = _rmsnorm(x, model.output_norm, c.rms_eps)
    return h @ _w(model.output).T                                            # (n, n_vocab)
