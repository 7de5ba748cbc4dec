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


def reference_logits(model: Llama, tokens) -> np.ndarray:
    """float64 logits (n_tokens, n_vocab) of ``tokens`` at positions 0..n-1 (the layer of
    ``quantkit.model.arch``'s docstring, step by step)."""
    c = model.config
    a = c.arch
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n, hd = tokens.size, c.head_dim
    x = model.token_embd.dequantize()[tokens].astype(np.float64) * c.embd_scale   # (n, n_embd)
    pos = np.arange(n)
    group = c.n_head // c.n_head_kv
    act = _gelu if a.glu == "gelu" else _silu
    for i, b in enumerate(model.blk):
        swa = c.is_swa(i)
        base, fscale, factors = (c.rope_freq_base_swa, 1.0, None) if swa else \
            (c.rope_freq_base, c.rope_freq_scale, model.rope_freqs)
        mask = np.where(pos[None, :] > pos[:, None], -np.inf, 0.0)                  # causal
        if swa:
            mask[pos[:, None] - pos[None, :] >= c.n_swa] = -np.inf                  # sliding window
        h = _rmsnorm(x, b.attn_norm, c.rms_eps)
        q, k, v = h @ _w(b.attn_q).T, h @ _w(b.attn_k).T, h @ _w(b.attn_v).T
        for name, t in (("attn_q_bias", q), ("attn_k_bias", k), ("attn_v_bias", v)):
            if getattr(b, name) is not None:
                t += getattr(b, name)
        if b.attn_q_norm is not None:
            q = _head_norm(q, c.n_head, hd, b.attn_q_norm, c.rms_eps)
            k = _head_norm(k, c.n_head_kv, hd, b.attn_k_norm, c.rms_eps)
        q = _rope(q, c.n_head, hd, c.n_rot, base, fscale, factors, a.rope_neox)
        k = _rope(k, c.n_head_kv, hd, c.n_rot, base, fscale, factors, a.rope_neox)
        q = q.reshape(n, c.n_head, hd).transpose(1, 0, 2)                   # (n_head, n, hd)
        k = np.repeat(k.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
        v = np.repeat(v.reshape(n, c.n_head_kv, hd).transpose(1, 0, 2), group, axis=0)
        s = q @ k.transpose(0, 2, 1) * c.kq_scale + mask                    # (n_head, n, n)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, c.n_head * hd) @ _w(b.attn_output).T
        if b.post_attention_norm is not None:
            o = _rmsnorm(o, b.post_attention_norm, c.rms_eps)
        x = x + o
        h = _rmsnorm(x, b.ffn_norm, c.rms_eps)
        f = (act(h @ _w(b.ffn_gate).T) * (h @ _w(b.ffn_up).T)) @ _w(b.ffn_down).T
        if b.post_ffw_norm is not None:
            f = _rmsnorm(f, b.post_ffw_norm, c.rms_eps)
        x = x + f
    h = _rmsnorm(x, model.output_norm, c.rms_eps)
    logits = h @ _w(model.output).T                                          # (n, n_vocab)
    if model.output_bias is not None:
        logits = logits + model.output_bias
    if c.softcap:
        logits = c.softcap * np.tanh(logits / c.softcap)
    return logits
