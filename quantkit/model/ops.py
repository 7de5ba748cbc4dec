"""The per-token ops of the forward pass besides the matrix products, as numba kernels: RMSNorm,
biases, RoPE, the Q/K preparation, the GLU (SiLU, ggml's table GELU), the residual add, and attention
over an fp16-bits or float32 KV cache (softmax helpers included). The compiled decode step
(``quantkit.model.decode``) and the batch path (``quantkit.model.forward``) both call them; numerics as
ggml's CPU ops (each function names the one it follows)."""

from __future__ import annotations

import math

import numpy as np

from quantkit.jit import bits_to_f32, njit_fast, njit_fast_parallel, prange
from quantkit.kernels.vecdot import build
from quantkit.quants.common import fp16_to_fp32, fp32_to_fp16

# -- norms, RoPE, GLU ---------------------------------------------------------------------------------------

_F = np.float32


@njit_fast(inline="always")
def expf(x):
    """exp of a float32 (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 polynomial, relative
    error ~1e-7), in plain float ops so loops over it vectorize (numba's np.exp is a scalar libm call
    per element without SVML). Inputs are clamped to [-87.3, 88.3] (softmax and SiLU never need more)."""
    x = min(max(x, _F(-87.3)), _F(88.3))
    n = np.floor(x * _F(1.44269504) + _F(0.5))
    r = x - n * _F(0.693359375)
    r = r + n * _F(2.12194440e-4)
    p = _F(1.9875691500e-4)
    p = p * r + _F(1.3981999507e-3)
    p = p * r + _F(8.3334519073e-3)
    p = p * r + _F(4.1665795894e-2)
    p = p * r + _F(1.6666665459e-1)
    p = p * r + _F(5.0000001201e-1)
    y = p * (r * r) + r + _F(1.0)
    return y * bits_to_f32((np.int32(n) + np.int32(127)) << np.int32(23))


@njit_fast(inline="always")
def max_f32(a, n):
    """max of a[:n] (n >= 1) of a 1-D float32 array. Eight running maxima (SLP makes them one vector):
    LLVM does not vectorize a single ``m = max(m, a[j])`` chain, a 4-cycle dependency per element
    (5x slower). No array for them: an allocation per row costs more inside a prange."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = a[0]
    n8 = n - n % 8
    for j in range(0, n8, 8):
        m0, m1, m2, m3 = max(m0, a[j]), max(m1, a[j + 1]), max(m2, a[j + 2]), max(m3, a[j + 3])
        m4, m5, m6, m7 = max(m4, a[j + 4]), max(m5, a[j + 5]), max(m6, a[j + 6]), max(m7, a[j + 7])
    m = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    for j in range(n8, n):
        m = max(m, a[j])
    return m


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
def rmsnorm1(x, w, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * w, sum of squares in float64 (as ggml)."""
    ss = 0.0
    for i in range(x.shape[0]):
        ss += np.float64(x[i]) * np.float64(x[i])
    scale = np.float32(1.0 / math.sqrt(ss / x.shape[0] + eps))
    for i in range(x.shape[0]):
        out[i] = x[i] * scale * w[i]


@njit_fast(inline="always")
def add_block(x, y, post, eps):
    """x += y, y first normed by ``post`` (RMSNorm; empty: none) -- a block's output into the residual."""
    if post.shape[0]:
        rmsnorm1(y, post, eps, y)
    for i in range(x.shape[0]):
        x[i] += y[i]


@njit_fast
def add_bias(v, b):
    """v += b when the layer has a bias (b of v's size), else nothing (b empty)."""
    if b.shape[0]:
        for i in range(v.shape[0]):
            v[i] += b[i]


@njit_fast
def rope_heads(v, n_heads, hd, n_rot, c, s, neox):
    """Rotate the first n_rot dims of each of the n_heads heads of v in place (ggml's rotate_pairs):
    NORM pairs (x[2i], x[2i+1]), NEOX pairs (x[i], x[i + n_rot/2]), pair i by the angle whose cos / sin
    are c[i] / s[i]."""
    half = n_rot // 2
    step = 1 if neox else 2
    off = half if neox else 1
    for h in range(n_heads):
        o = h * hd
        for i in range(half):
            j = o + i * step
            x0 = v[j]
            x1 = v[j + off]
            v[j] = x0 * c[i] - x1 * s[i]
            v[j + off] = x0 * s[i] + x1 * c[i]


@njit_fast
def qk_prepare(q, k, v, qb, kb, vb, qn, kn, full, eps, n_head, n_head_kv, hd, n_rot, c, s, neox):
    """One token's q (n_head*hd), k and v (n_head_kv*hd) straight out of their products, in place:
    + biases (empty arrays: none), RMSNorm of q and k times qn / kn (empty: none) per head (Qwen3,
    Gemma 3) or, ``full``, over the whole of q and of k (OLMo 2), then RoPE of q and k (n_rot 0: none,
    SmolLM3's NoPE layers). The batch path and the decode step both run this."""
    add_bias(q, qb)
    add_bias(k, kb)
    add_bias(v, vb)
    if qn.shape[0] and full:
        rmsnorm1(q, qn, eps, q)
        rmsnorm1(k, kn, eps, k)
    elif qn.shape[0]:
        for h in range(n_head):
            rmsnorm1(q[h * hd:(h + 1) * hd], qn, eps, q[h * hd:(h + 1) * hd])
        for h in range(n_head_kv):
            rmsnorm1(k[h * hd:(h + 1) * hd], kn, eps, k[h * hd:(h + 1) * hd])
    rope_heads(q, n_head, hd, n_rot, c, s, neox)
    rope_heads(k, n_head_kv, hd, n_rot, c, s, neox)


@njit_fast
def mla_prepare(q, kv, kv_norm, eps, n_head, n_nope, n_rot, c, s, neox):
    """One token's multi-head latent attention inputs straight out of their products, in place
    (quantkit.model.layer.MLA): RoPE on the last n_rot dims of each of q's n_head heads (n_nope + n_rot
    each) and on kv's last n_rot (k_pe), RMSNorm of kv's first part (the latent) times kv_norm. The batch
    path and the decode step both run this."""
    hk = n_nope + n_rot
    rope_heads(q[n_nope:], n_head, hk, n_rot, c, s, neox)     # head h's rope part at h * hk + n_nope
    n_lat = kv.shape[0] - n_rot
    rope_heads(kv[n_lat:], 1, n_rot, n_rot, c, s, neox)
    rmsnorm1(kv[:n_lat], kv_norm, eps, kv[:n_lat])


#: ``GLU_KINDS`` index of each activation
GLU_SILU, GLU_GELU, GLU_SWIGLU_OAI = 0, 1, 2
#: ggml_swiglu_oai's constants as build_moe_ffn passes them (LLM_FFN_SWIGLU_OAI_MOE)
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0
#: a sink logit meaning "no sink" (float32's lowest)
NO_SINK = float(np.finfo(np.float32).min)


def gelu_table() -> np.ndarray:
    """ggml's ``ggml_table_gelu_f16`` as float32 (65536,): the tanh GELU of every fp16 value, rounded
    to fp16 (ggml_cpu_init). ggml's GELU of a float32 x (GGML_GELU_FP16): 0 for x <= -10, x for
    x >= 10, else this table at fp16(x)."""
    f = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        g = _F(0.5) * f * (_F(1.0) + np.tanh(_F(0.79788456080286535587989211986876) * f
                                            * (_F(1.0) + _F(0.044715) * f * f)))
    return g.astype(np.float16).astype(np.float32)


@njit_fast
def glu(g, u, out, kind, table):
    """out = act(g) * u: SiLU (ggml_vec_swiglu_f32), ggml's table GELU (ggml_vec_geglu_f32) or
    ggml_swiglu_oai (g clamped above at 7, u to [-7, 7]: g / (1 + exp(-1.702 g)) * (u + 1))."""
    if kind == GLU_SILU:
        for r in range(g.shape[0]):
            x = g[r]
            out[r] = x / (np.float32(1.0) + expf(-x)) * u[r]
    elif kind == GLU_SWIGLU_OAI:
        lim = np.float32(OAI_LIMIT)
        for r in range(g.shape[0]):
            x = min(g[r], lim)
            y = min(max(u[r], -lim), lim)
            out[r] = x / (np.float32(1.0) + expf(np.float32(OAI_ALPHA) * -x)) * (y + np.float32(1.0))
    else:
        for r in range(g.shape[0]):
            x = g[r]
            if x <= np.float32(-10.0):
                out[r] = 0.0
            elif x >= np.float32(10.0):
                out[r] = x * u[r]
            else:
                out[r] = table[fp32_to_fp16(x)] * u[r]


@njit_fast_parallel
def shortconv(bcx, w, state, out):
    """LFM2's gated short convolution (quantkit.model.layer.ShortConv) of n consecutive positions:
    bcx (n, 3 E) the in_proj rows (b, c, x), w (E, l_cache) each channel's taps, state (l_cache - 1, E)
    the u = b * x of the positions before the first (oldest first; updated to the last l_cache - 1 on
    return), out (n, >= E): its first E columns <- c * conv. As ggml: u in float32 (ggml_mul), each output a float32 sum over the
    taps from 0 in their order (ggml_compute_forward_ssm_conv_f32), then times c. One channel per
    iteration: the same values for any thread count. The batch path runs a whole ubatch through it, the
    decode step one position."""
    n = bcx.shape[0]
    E, L = w.shape
    d = L - 1
    for ch in prange(E):
        for t in range(n):
            acc = np.float32(0.0)
            for k in range(L):
                j = t + k - d       # the position of tap k: before the batch -> the state
                u = state[d + j, ch] if j < 0 else bcx[j, ch] * bcx[j, 2 * E + ch]
                acc += u * w[ch, k]
            out[t, ch] = bcx[t, E + ch] * acc
        for k in range(d):          # the last d positions' u (state[d + j] is read before it is written)
            j = n - d + k
            state[k, ch] = state[d + j, ch] if j < 0 else bcx[j, ch] * bcx[j, 2 * E + ch]


@njit_fast_parallel
def delta_net(qkv, z, ba, conv_w, dt_bias, ssm_a, norm_w, eps, n_k, state, out):
    """Qwen3-Next's gated DeltaNet (quantkit.model.layer.DeltaNet) of n consecutive positions, after its
    three input products: qkv (n, conv_dim) attn_qkv's rows, z (n, value_dim) attn_gate's, ba (n, 2 n_v)
    ssm_ba's; conv_w (conv_dim, d_conv) ssm_conv1d, dt_bias / ssm_a (n_v,), norm_w (head_dim,) ssm_norm;
    state: the layer's state row (DeltaNet.state_size, float32: the convolution's window, then each value
    head's matrix S[v, k]), read at the first position and left as at the last; out (n, >= value_dim) <-
    the gated norm's output, the input of ssm_out.

    As llama.cpp's CPU graph: ggml_ssm_conv (a float32 sum over the taps in their order) and ggml_silu;
    build_gdn_l2_norm (ggml_rms_norm with eps / head_dim, its sum in double, times 1/sqrt(head_dim));
    sigmoid(b), softplus (ggml_compute_softplus_f32: x above 20) of a + dt_bias times ssm_a; then per value
    head and position the fused ggml_gated_delta_net -- S *= exp(g); delta = (v - S k) beta; S += delta k^T;
    o = (S q) / sqrt(head_dim) -- the delta rule token by token, for a batch as for one token (llama.cpp's
    CPU backend runs the fused op; build_delta_net_chunking, the same sum in chunks of 64, only where a
    backend lacks it); then ggml_rms_norm(o) * ssm_norm * silu(z). Channels, then value heads, one per
    iteration: the same values for any thread count."""
    n, C = qkv.shape
    K = conv_w.shape[1]
    d = K - 1
    n_v = dt_bias.shape[0]
    S = norm_w.shape[0]
    kd = n_k * S
    r = n_v // n_k
    win = state[:d * C].reshape(d, C)
    mats = state[d * C:d * C + n_v * S * S].reshape(n_v, S, S)
    c = np.empty((n, C), np.float32)
    for ch in prange(C):        # the causal convolution over the window and the rows, then SiLU
        for t in range(n):
            acc = np.float32(0.0)
            for i in range(K):
                j = t + i - d       # the position of tap i: before the rows -> the window
                x = win[d + j, ch] if j < 0 else qkv[j, ch]
                acc += x * conv_w[ch, i]
            c[t, ch] = acc / (np.float32(1.0) + np.exp(-acc))
        for i in range(d):          # the last d inputs (win[d + j] is read before it is written)
            j = n - d + i
            win[i, ch] = win[d + j, ch] if j < 0 else qkv[j, ch]
    scale = np.float32(1.0) / np.sqrt(np.float32(S))
    inv_s = np.float32(1.0) / np.sqrt(np.float32(S))
    eps_l2 = np.float32(eps) / np.float32(S)
    for h in prange(n_v):
        kh = h // r                 # the key head this value head reads (repeat-interleave)
        g_, i_ = h // r, h % r      # ssm_ba's row: per key-head group [b (r), a (r)]
        m = mats[h]
        q = np.empty(S, np.float32)
        k = np.empty(S, np.float32)
        dl = np.empty(S, np.float32)
        o = np.empty(S, np.float32)
        for t in range(n):
            sq = 0.0
            sk = 0.0
            for i in range(S):
                sq += np.float64(c[t, kh * S + i]) ** 2
                sk += np.float64(c[t, kd + kh * S + i]) ** 2
            fq = np.float32(1.0) / np.sqrt(np.float32(sq / S) + eps_l2)
            fk = np.float32(1.0) / np.sqrt(np.float32(sk / S) + eps_l2)
            for i in range(S):
                q[i] = c[t, kh * S + i] * fq * inv_s
                k[i] = c[t, kd + kh * S + i] * fk * inv_s
            beta = np.float32(1.0) / (np.float32(1.0) + np.exp(-ba[t, g_ * 2 * r + i_]))
            a = ba[t, g_ * 2 * r + r + i_] + dt_bias[h]
            sp = a if a > np.float32(20.0) else np.log(np.float32(1.0) + np.exp(a))
            decay = np.exp(np.float32(sp * ssm_a[h]))
            v0 = 2 * kd + h * S
            for j in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    m[j, i] *= decay
                    acc += m[j, i] * k[i]
                dl[j] = (c[t, v0 + j] - acc) * beta
            ss = 0.0
            for j in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    m[j, i] += k[i] * dl[j]
                    acc += m[j, i] * q[i]
                o[j] = acc * scale
                ss += np.float64(o[j]) ** 2
            fo = np.float32(1.0) / np.sqrt(np.float32(ss / S) + np.float32(eps))
            for j in range(S):
                zz = z[t, h * S + j]
                out[t, h * S + j] = o[j] * fo * norm_w[j] * (zz / (np.float32(1.0) + np.exp(-zz)))


@njit_fast
def window_start(n_kv, n_swa):
    """First cache position a query at position n_kv - 1 sees: 0, or with a sliding window of n_swa
    the keys p with (n_kv - 1) - p < n_swa (llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD), or
    with n_swa < 0, chunks of -n_swa positions, the keys from its chunk's start on (LLAMA_SWA_TYPE_CHUNKED;
    ``layer.Attn.window``)."""
    if n_swa < 0:
        return (n_kv - 1) // -n_swa * -n_swa
    return max(0, n_kv - n_swa) if n_swa > 0 else 0


@njit_fast
def attn_temperature(pos, floor_scale, scale, offset):
    """The query's temperature at position ``pos`` (llm_graph_input_attn_temp::set_input: float position
    plus offset over the floor scale, floored, in float; the log and the rest in double; stored as float):
    1 + scale * log(floor((pos + offset) / floor_scale) + 1). floor_scale 0: 1."""
    if floor_scale == 0:
        return np.float32(1.0)
    f = np.floor((np.float32(pos) + np.float32(offset)) / np.float32(floor_scale))
    return np.float32(math.log(np.float64(f) + 1.0) * np.float64(np.float32(scale)) + 1.0)


@njit_fast
def qk_finish(q, k, n_head, n_head_kv, hd, l2, eps, temp):
    """After ``qk_prepare`` (RoPE), in place: q times ``temp`` (unless 1: Llama 4's NoPE layers), then with
    ``l2`` q and k RMS-normed per head without a weight (ggml_rms_norm: Llama 4's RoPE layers)."""
    if temp != np.float32(1.0):
        for i in range(q.shape[0]):
            q[i] *= temp
    if l2:
        for h in range(n_head):
            _rmsnorm_plain(q[h * hd:(h + 1) * hd], eps)
        for h in range(n_head_kv):
            _rmsnorm_plain(k[h * hd:(h + 1) * hd], eps)


@njit_fast
def _rmsnorm_plain(x, eps):
    """x <- x / sqrt(mean(x^2) + eps), sum of squares in float64 (ggml_rms_norm, no weight)."""
    ss = 0.0
    for i in range(x.shape[0]):
        ss += np.float64(x[i]) * np.float64(x[i])
    scale = np.float32(1.0 / math.sqrt(ss / x.shape[0] + eps))
    for i in range(x.shape[0]):
        x[i] = x[i] * scale


# -- attention over the KV cache -------------------------------------------------------------------

@njit_fast
def kv_f16_store(v):
    return fp32_to_fp16(v)


@njit_fast
def kv_f16_load(h):
    return fp16_to_fp32(h)


@njit_fast
def kv_f32_same(v):
    return v


def kv_dot(q, k, n):
    """q[:n] . k[:n], ``k`` a slice of a K cache row (``LD_KV`` loads it)."""
    acc = np.float32(0.0)
    for i in range(n):
        acc += q[i] * LD_KV(k[i])  # noqa: F821
    return acc


def kv_axpy(p, v, y, n):
    """y[:n] += p * v[:n], ``v`` a slice of a V cache row."""
    for i in range(n):
        y[i] += p * LD_KV(v[i])  # noqa: F821


@njit_fast(inline="always")
def exp_shift_sum(s, n, mx):
    """s[:n] <- exp(s[:n] - mx); -> their float32 sum."""
    tot = np.float32(0.0)
    for t in range(n):
        e = expf(s[t] - mx)
        s[t] = e
        tot += e
    return tot


@njit_fast(inline="always")
def exp_sink_inv(s, n, sink):
    """s[:n] <- exp(s[:n] - mx), mx the max of s[:n] and of the ``sink`` logit (NO_SINK: none); -> 1 /
    (their float32 sum + exp(sink - mx)): a softmax's factor with the sink in its max and denominator
    (ggml_soft_max_add_sinks). The attention's softmax of both paths (``attend_head``, the batch path's
    rows)."""
    mx = max_f32(s, n)
    if sink > np.float32(NO_SINK):
        mx = max(mx, sink)
        return np.float32(1.0) / (exp_shift_sum(s, n, mx) + expf(sink - mx))
    return np.float32(1.0) / exp_shift_sum(s, n, mx)


@njit_fast(inline="always")
def softcap_scores(s, n, cap):
    """s[:n] <- cap * tanh(s[:n] / cap) (cap 0: nothing): the attention's logit soft-capping, after the
    scale and before the mask and softmax (build_attn_mha's attn_soft_cap; flash attention's logit_softcap
    divides the scale by cap, then applies cap * tanh)."""
    if cap != np.float32(0.0):
        inv = np.float32(1.0) / cap
        for t in range(n):
            s[t] = cap * np.tanh(s[t] * inv)


def attend_head(q, kl, vl, ko, vo, k0, n_kv, scale, softcap, sink, s, y):
    """One query head over the cache: y <- softmax(scale * K q) V, K the rows k0..n_kv-1 of kl (n_ctx,
    ...) from column ko (q's width), V those of vl from column vo (y's width) (k0 > 0: a sliding window;
    the rows before it are masked; MLA: vl is kl, V the latent at the start of its rows); ``softcap``: the
    scaled logits soft-capped (``softcap_scores``; 0: not); ``sink``: the head's sink logit (gpt-oss;
    NO_SINK: none), which joins the max and the
    denominator as ggml_soft_max_add_sinks; s (>= n_kv - k0) scratch for the scores. ggml's
    op order (scale, max, exp, float32 sum, multiply by 1 / sum). Its loops are functions of their
    own on 1-D slices: written inside a prange body they stayed scalar (10x slower; over 768 cached
    positions attention was most of a decode step's time)."""
    hd = q.shape[0]
    dv = y.shape[0]
    m = n_kv - k0
    for t in range(m):
        s[t] = KV_DOT(q, kl[k0 + t, ko:ko + hd], hd) * scale  # noqa: F821
    softcap_scores(s, m, softcap)
    inv = exp_sink_inv(s, m, sink)
    y[:] = 0.0
    for t in range(m):
        KV_AXPY(s[t] * inv, vl[k0 + t, vo:vo + dv], y, dv)  # noqa: F821


def attend_kernel(kv_f16: bool):
    """The compiled ``attend_head`` for an fp16-bits (uint16) or float32 KV cache."""
    tag = "kv16" if kv_f16 else "kv32"
    ld = kv_f16_load if kv_f16 else kv_f32_same
    return build(attend_head, tag, False, KV_DOT=build(kv_dot, tag, False, LD_KV=ld),
                 KV_AXPY=build(kv_axpy, tag, False, LD_KV=ld))
