"""Tiny random-weight GGUFs of the qwen2, qwen3, gemma3, smollm3, olmo2 and gemma2 architectures, written with
gguf.GGUFWriter.

Needs only numpy and gguf (no quantkit): tools/make_arch_golden.py imports it in llama.cpp's reference
venv to write the very files llama.cpp ran for tests/data/arch/, and the tests write them again here
(the golden files store each file's sha256, checked before comparing).

Each model exercises what its architecture adds: qwen2 Q/K/V biases and a tied output; qwen3 per-head
Q/K norms with head_dim * n_head != n_embd; gemma3 Q/K norms plus post-norms, GELU, the embedding
scale, sliding-window layers (window 8, so the 48-token golden sequences slide) with their own RoPE base
and a final-logit soft-cap; smollm3 a layer without RoPE; olmo2 no input norms, whole-projection Q/K
norms and sliding layers with the model's RoPE base; gemma2 attention logit soft-capping and alternating
sliding layers. The output matrix is wide (logits of std 4 to 8) so the next-token
distribution is peaked: a wrong op shows up as a different top token, not as noise in a flat one.

Variants: "F16" (matrices F16, the rest F32) and "Q" (matrices Q8_0 / Q4_0 / Q5_0 / Q4_1 made by
gguf.quants, byte-identical to ggml's reference quantizers).

``MOE_SPECS``: mixture-of-experts models written by the same function -- ``qwen3moe`` (8 experts, 2 used,
``expert_feed_forward_length``), ``mixtral``, a ``llama`` file with ``llama.expert_count`` 4 (Mixtral's
layout), ``qwen2moe`` (8 experts, 4 used, Q/K/V biases, a shared expert of another width with its
sigmoid gate) and ``gpt-oss`` (attention sinks, the attention output's bias, alternating sliding-window
layers, YaRN RoPE, the router's and the experts' biases, the clamped SwiGLU; MXFP4 experts in "Q"). The router ``ffn_gate_inp`` stays F32 in every variant, as llama-quantize leaves it.
``router="zero"``: an all-zero router, so every expert ties and every token goes to experts 0..k-1.
``MLA_SPECS``: ``deepseek2`` files (multi-head latent attention with DeepSeek's routing and shared experts).
``lfm2`` (SPECS) and ``lfm2moe`` (MOE_SPECS): hybrids whose layers with ``kv_layers`` 0 are LFM2's gated short
convolutions (``shortconv.in_proj`` / ``conv`` / ``out_proj``), the final norm ``token_embd_norm``.
``DELTANET_SPECS``: ``qwen3next`` files (gated DeltaNet layers, gated attention, a gated shared expert).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

#: per architecture: the hyperparameters (and which optional parts the file has)
SPECS = {
    "qwen2": dict(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=None, n_vocab=512,
                  rope_base=1000000.0, eps=1e-6, bias=True, qk_norm=False, post_norms=False, tied=True),
    "qwen3": dict(n_layer=2, n_embd=256, n_ff=512, n_head=8, n_head_kv=2, head_dim=64, n_vocab=512,
                  rope_base=1000000.0, eps=1e-6, bias=False, qk_norm=True, post_norms=False, tied=False),
    "gemma3": dict(n_layer=6, n_embd=256, n_ff=512, n_head=4, n_head_kv=1, head_dim=128, n_vocab=512,
                   rope_base=1000000.0, eps=1e-6, bias=False, qk_norm=True, post_norms=True, tied=False,
                   sliding_window=8, softcap=30.0),
    # SmolLM3: llama's layer (NORM RoPE), layer 3 without RoPE (every fourth)
    "smollm3": dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=None, n_vocab=512,
                    rope_base=2000000.0, eps=1e-6, bias=False, qk_norm=False, post_norms=False, tied=True,
                    qk_std=1.0),
    # OLMo 2: no input norms, Q/K norms over the whole projections, post-norms; with a sliding window (as
    # OLMo 3's files) on layers 0-2 (load_swa_pattern(4)), rotated with the model's base
    "olmo2": dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=None, n_vocab=512,
                  rope_base=500000.0, eps=1e-6, bias=False, qk_norm="full", post_norms=True, tied=False,
                  pre_norms=False, sliding_window=8),
    # Gemma 2: post-norms, GELU, the embedding scale, layers 0 and 2 sliding (window 8), attention logits
    # soft-capped at 5 (so the cap bites) and the final ones at 30
    "gemma2": dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=128, n_vocab=512,
                   rope_base=10000.0, eps=1e-6, bias=False, qk_norm=False, post_norms=True, tied=True,
                   sliding_window=8, softcap=30.0, attn_softcap=5.0, embd_std=0.25, post_norm=(14.0, 18.0)),
    # LFM2: gated short-convolution layers (head_count_kv 0: layers 0, 1 and 3) around an attention layer with
    # per-head Q/K norms and NEOX RoPE, convolutions 3 wide, the final norm token_embd_norm, a tied output
    "lfm2": dict(n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=None, n_vocab=512,
                 rope_base=1000000.0, eps=1e-5, bias=False, qk_norm=True, post_norms=False, tied=True,
                 kv_layers=[0, 0, 2, 0], l_cache=3, output_norm="token_embd_norm"),
}
#: mixture-of-experts models: the dense keys above plus n_expert, n_used, n_ff_exp (the experts' width)
MOE_SPECS = {
    "qwen3moe": dict(arch="qwen3moe", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=48,
                     n_vocab=512, rope_base=1000000.0, eps=1e-6, bias=False, qk_norm=True, post_norms=False,
                     tied=False, n_expert=8, n_used=2, n_ff_exp=64),
    "mixtral": dict(arch="llama", n_layer=2, n_embd=128, n_ff=96, n_head=4, n_head_kv=2, head_dim=None,
                    n_vocab=512, rope_base=10000.0, eps=1e-5, bias=False, qk_norm=False, post_norms=False,
                    tied=False, n_expert=4, n_used=2),
    "qwen2moe": dict(arch="qwen2moe", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=None,
                     n_vocab=512, rope_base=1000000.0, eps=1e-6, bias=True, qk_norm=False, post_norms=False,
                     tied=False, n_expert=8, n_used=4, n_ff_exp=64, n_ff_shexp=160),
    # gpt-oss: sinks, biases everywhere, layer 0 sliding (window 8), YaRN (factor 4 over 32 positions),
    # gates wide enough that the SwiGLU's clamp at 7 bites; its "Q" experts are MXFP4 (MXFP4_MOE's)
    "gpt-oss": dict(arch="gpt-oss", n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, head_dim=48,
                    n_vocab=512, rope_base=150000.0, eps=1e-5, bias=True, qk_norm=False, post_norms=False,
                    tied=False, n_expert=8, n_used=2, n_ff_exp=64, sliding_window=8, yarn=(4.0, 32),
                    gate_scale=4.0, q_types={"ffn_gate_exps": T.MXFP4, "ffn_up_exps": T.MXFP4,
                                             "ffn_down_exps": T.MXFP4}),
    # glm4moe (GLM-4.5): a leading dense layer, sigmoid routing with exp_probs_b over 8 experts in one group,
    # normalized weights times 2.5, an ungated shared expert (expert_shared_count 1), Q/K/V biases,
    # per-head Q/K norms, NEOX RoPE over half of each head, the FFN normed by post_attention_norm, and one
    # multi-token-prediction block after the 3 trunk blocks (nextn_predict_layers: written, not run)
    "glm4moe": dict(arch="glm4moe", n_layer=3, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=48,
                    n_vocab=512, rope_base=1000000.0, eps=1e-5, bias=True, qk_norm=True, post_norms=False,
                    tied=False, n_expert=8, n_used=2, n_ff_exp=64, lead_dense=1, score_bias=True, shexp_count=1,
                    rope_dim=24, ffn_norm="post_attention_norm", nextn=1,
                    moe_keys={"leading_dense_block_count": 1, "expert_gating_func": 2, "expert_shared_count": 1,
                              "expert_weights_norm": True, "expert_weights_scale": 2.5}),
    # granitemoe (Granite 3.x MoE, GraniteMoeShared): Mixtral's layout (experts as wide as n_ff) with
    # Granite's embedding / residual / attention / logit scales and an ungated shared expert
    "granitemoe": dict(arch="granitemoe", n_layer=2, n_embd=128, n_ff=64, n_head=4, n_head_kv=2, head_dim=None,
                       n_vocab=512, rope_base=10000.0, eps=1e-6, bias=False, qk_norm=False, post_norms=False,
                       tied=False, n_expert=8, n_used=2, n_ff_shexp=96, shexp_gate=False,
                       moe_keys={"embedding_scale": 3.0, "residual_scale": 0.5, "attention.scale": 0.03,
                                 "logit_scale": 1.5}),
    # ernie4_5-moe (ERNIE 4.5 MoE): NORM RoPE, a leading dense layer, softmax routing with the optional
    # score bias exp_probs_b, an ungated shared expert. Seed 1: with seeds 0 and 2-5 one token of the
    # imatrix sample (256 tokens) took another expert in llama-imatrix than here, the golden logits' ids a
    # tie of 4e-4 router logits (position 45, seed 0): routing near-ties at fp16 noise, not a rule apart
    "ernie4_5-moe": dict(arch="ernie4_5-moe", n_layer=3, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=None,
                         n_vocab=512, rope_base=500000.0, eps=1e-5, bias=False, qk_norm=False, post_norms=False,
                         tied=False, n_expert=8, n_used=2, n_ff_exp=64, n_ff_shexp=96, shexp_gate=False,
                         lead_dense=1, score_bias=0.05, seed=1,
                         moe_keys={"leading_dense_block_count": 1, "interleave_moe_layer_step": 1}),
    # llama4 (Llama 4 Scout / Maverick's text model): layers 0-2 chunked (llama.cpp's chunk is 8192 whatever
    # the file says, so the context is long enough to pass it: tools/make_arch_golden.py's long golden),
    # layer 3 global without RoPE (the query temperature), the weightless L2 q/k norm on the RoPE layers,
    # rope_freqs, MoE layers 1 and 3 (interleave_moe_layer_step 2) with 4 experts, 1 used, sigmoid-gated
    # on the expert's input, and an ungated shared expert of an expert's width. Seed 2: with seed 0 layer 1's
    # router logits of one greedy position were 0.003 apart, a tie at fp16 noise (llama.cpp took the other)
    "llama4": dict(arch="llama4", n_layer=4, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=None,
                   n_vocab=512, rope_base=500000.0, eps=1e-5, bias=False, qk_norm=False, post_norms=False,
                   tied=False, n_expert=4, n_used=1, n_ff_exp=64, shexp_count=1, moe_step=2, rope_freqs=True,
                   n_ctx=8448, seed=2, moe_keys={"interleave_moe_layer_step": 2}),
    # minimax-m2 (MiniMax-M2): RMSNorm over the whole Q and K projections, NEOX RoPE over half of each head,
    # sigmoid routing (the file's expert_gating_func) with exp_probs_b, normalized weights; the experts as
    # wide as feed_forward_length (the converter writes expert_feed_forward_length equal to it); a context of
    # 512 for tools/arch_agreement.sh's chunks. A score bias of +-0.05: at +-0.3 it decided most choices, some
    # experts got one token of the imatrix sample (256), whose near-zero inputs' squares differ by 30 % at fp16
    # noise, and near ties were many (one token took another expert in llama-imatrix)
    "minimax-m2": dict(arch="minimax-m2", n_layer=2, n_embd=128, n_ff=64, n_head=4, n_head_kv=2, head_dim=48,
                       n_vocab=512, rope_base=5000000.0, eps=1e-6, bias=False, qk_norm="full", post_norms=False,
                       tied=False, n_expert=8, n_used=2, n_ff_exp=64, score_bias=0.05, rope_dim=24,
                       router_scale=2.0, n_ctx=512, seed=0, moe_keys={"expert_gating_func": 2}),
    # lfm2moe (LFM2-8B-A1B): lfm2's convolution and attention layers, a leading dense FFN, then sigmoid routing
    # with the score bias over 8 experts, weights normalized
    "lfm2moe": dict(arch="lfm2moe", n_layer=4, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=None,
                    n_vocab=512, rope_base=1000000.0, eps=1e-5, bias=False, qk_norm=True, post_norms=False,
                    tied=True, n_expert=8, n_used=2, n_ff_exp=64, lead_dense=1, score_bias=True,
                    kv_layers=[0, 0, 2, 0], l_cache=3, output_norm="token_embd_norm",
                    moe_keys={"leading_dense_block_count": 1, "expert_gating_func": 2}),
}
#: models of no architecture llama.cpp has in this form, for the forward paths' own tests against the float64
#: reference (no llama.cpp golden): DeepSeek V3's routing on qwen3moe's layers (tests/test_moe.py gives the
#: qwen3moe row the MoE keys, Arch.moe_hparams, and an ungated shared expert) -- a leading dense layer,
#: sigmoid gating with a per-expert score bias (exp_probs_b), 4 groups of 2 experts of which 2 are eligible,
#: normalized weights times 2.5, a shared expert of twice an expert's width added without a gate
PROGRAM_SPECS = {
    "moe-lead-dense": dict(arch="qwen3moe", n_layer=3, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=48,
                           n_vocab=512, rope_base=1000000.0, eps=1e-6, bias=False, qk_norm=True, post_norms=False,
                           tied=False, n_expert=8, n_used=2, n_ff_exp=64, lead_dense=1, score_bias=True,
                           shexp_count=2,
                           moe_keys={"leading_dense_block_count": 1, "expert_gating_func": 2, "expert_shared_count": 2,
                                     "expert_weights_norm": True, "expert_weights_scale": 2.5,
                                     "expert_group_count": 4, "expert_group_used_count": 2}),
}
#: multi-head latent attention (``deepseek2``, llama.cpp's converter's form: attn_k_b / attn_v_b split, the
#: cache's key_length / value_length kv_lora_rank + n_rot / kv_lora_rank, head_count_kv 1): ``mla`` gives
#: q_lora_rank (0: attn_q, as V2-Lite), kv_lora_rank, a head's nope and rope dims and its value dims.
#: ``deepseek2`` is DeepSeek V3 in small -- q through its low rank, a leading dense layer, sigmoid gating
#: with a score bias, 4 groups of 2 experts of which 2 are eligible, normalized weights times 2.5, one
#: shared expert, YaRN with mscale_all_dim 1, router logits of std ~2 (sigmoid scores saturate beyond: the
#: choice would then be the score bias's and near ties); ``deepseek2-lite`` is V2-Lite's kind -- q straight from
#: attn_q (q_lora_rank 0: llama.cpp reads the key unless the layer count is V2-Lite's), softmax gating,
#: weights not normalized, two shared experts, value heads wider than the nope part, mscale_all_dim 0.707
MLA_SPECS = {
    "deepseek2": dict(arch="deepseek2", n_layer=3, n_embd=128, n_ff=192, n_head=4, n_head_kv=1, head_dim=None,
                      n_vocab=512, rope_base=10000.0, eps=1e-6, bias=False, qk_norm=False, post_norms=False,
                      tied=False, n_expert=8, n_used=2, n_ff_exp=64, lead_dense=1, score_bias=True, shexp_count=1,
                      router_scale=2.0, mla=dict(q_lora=96, kv_lora=64, nope=32, rope=16, v=32), yarn=(4.0, 32),
                      yarn_log_mul=0.1,
                      moe_keys={"leading_dense_block_count": 1, "expert_gating_func": 2, "expert_shared_count": 1,
                                "expert_weights_norm": True, "expert_weights_scale": 2.5,
                                "expert_group_count": 4, "expert_group_used_count": 2}),
    "deepseek2-lite": dict(arch="deepseek2", n_layer=3, n_embd=128, n_ff=192, n_head=4, n_head_kv=1, head_dim=None,
                           n_vocab=512, rope_base=10000.0, eps=1e-6, bias=False, qk_norm=False, post_norms=False,
                           tied=False, n_expert=8, n_used=3, n_ff_exp=64, lead_dense=1, shexp_count=2,
                           mla=dict(q_lora=0, kv_lora=64, nope=32, rope=16, v=48), yarn=(4.0, 32),
                           yarn_log_mul=0.0707,
                           moe_keys={"leading_dense_block_count": 1, "expert_gating_func": 1, "expert_shared_count": 2,
                                     "expert_weights_scale": 1.0}),
}
#: gated DeltaNet models (``qwen3next``, llama.cpp's converter's form: attn_qkv / attn_gate, not the legacy
#: ssm_in): ``delta`` gives the key heads, value heads (a multiple: each key head serves two), the head size
#: and the convolution's taps; layers 0-2 DeltaNet, 3 gated attention (full_attention_interval 4), a quarter
#: of each attention head rotated, every FFN a MoE with a gated shared expert normed by post_attention_norm.
#: Seed 1: with seed 0 one token of the imatrix sample took expert 0 instead of 3 in layer 1 in llama-imatrix
#: (a routing near-tie at fp16 noise, carried on by the recurrent state); seeds 1-4 give its counts exactly
DELTANET_SPECS = {
    "qwen3next": dict(arch="qwen3next", n_layer=4, n_embd=128, n_ff=192, n_head=4, n_head_kv=2, head_dim=32,
                      n_vocab=512, rope_base=1000000.0, eps=1e-6, bias=False, qk_norm=True, post_norms=False,
                      tied=False, n_expert=8, n_used=2, n_ff_exp=64, n_ff_shexp=96, rope_dim=8,
                      ffn_norm="post_attention_norm", delta=dict(n_k=2, n_v=4, head=32, conv=4), seed=1),
}
N_CTX = 128
#: the layers' outputs are large beside the embeddings (rms ~3 each), so a tied output's logits are not
#: dominated by the input token's own embedding (it would be every position's top token)
RESID = 3.0
VARIANTS = {
    "F16": {},
    "Q": {"token_embd": T.Q8_0, "attn_q": T.Q4_0, "attn_k": T.Q8_0, "attn_v": T.Q5_0, "attn_output": T.Q4_1,
          "ffn_gate": T.Q4_0, "ffn_up": T.Q5_0, "ffn_down": T.Q8_0, "output": T.Q8_0,
          "ffn_gate_exps": T.Q4_0, "ffn_up_exps": T.Q5_0, "ffn_down_exps": T.Q8_0,
          "ffn_gate_shexp": T.Q4_1, "ffn_up_shexp": T.Q8_0, "ffn_down_shexp": T.Q5_0,
          "attn_q_a": T.Q8_0, "attn_q_b": T.Q4_0, "attn_kv_a_mqa": T.Q5_0, "attn_k_b": T.Q8_0, "attn_v_b": T.Q4_1,
          "attn_qkv": T.Q5_0, "attn_gate": T.Q4_1, "ssm_ba": T.Q8_0, "ssm_out": T.Q4_0,
          "shortconv.in_proj": T.Q4_1, "shortconv.out_proj": T.Q5_0},
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for each byte (the byte-level BPE vocabulary's first 256 tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def _vocab(n_vocab: int) -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary: 256 bytes, merges of letter pairs, 3 special tokens at the end."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = _bytes_to_unicode()
    merges = []
    letters = "etaoinshrdlucmfw"
    for a in letters:
        for b in letters:
            if len(tokens) + len(specials) >= n_vocab:
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    types = [1] * len(tokens) + [3] * len(specials)
    return tokens + specials, merges, types


def write_model(path: Path, arch: str, variant: str = "F16", seed: int = 0, drop: str | None = None,
                n_used: int | None = None, router: str = "random") -> Path:
    """Write the tiny ``arch`` model (a key of SPECS or MOE_SPECS); ``drop``: leave that tensor out (a
    broken file for the refusals); MoE only: ``n_used`` experts per token instead of the spec's, and
    ``router`` "random" or "zero"."""
    s = {**SPECS, **MOE_SPECS, **PROGRAM_SPECS, **MLA_SPECS, **DELTANET_SPECS}[arch]
    arch = s.get("arch", arch)
    n_exp = s.get("n_expert", 0)
    rng = np.random.default_rng(s.get("seed", seed))
    E, F, V, H, HKV = s["n_embd"], s["n_ff"], s["n_vocab"], s["n_head"], s["n_head_kv"]
    hd = s["head_dim"] or E // H
    types = {**VARIANTS[variant], **(s.get("q_types", {}) if variant != "F16" else {})}
    oss = arch == "gpt-oss"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", s["n_layer"] + s.get("nextn", 0))
    if "nextn" in s:
        w.add_uint32(f"{arch}.nextn_predict_layers", s["nextn"])
    if "rope_dim" in s:
        w.add_uint32(f"{arch}.rope.dimension_count", s["rope_dim"])
    w.add_uint32(f"{arch}.context_length", s.get("n_ctx", N_CTX))
    w.add_uint32(f"{arch}.embedding_length", E)
    w.add_uint32(f"{arch}.feed_forward_length", F)
    w.add_uint32(f"{arch}.attention.head_count", H)
    if "kv_layers" in s:    # per layer; 0: a recurrent layer (LFM2's short convolution)
        w.add_array(f"{arch}.attention.head_count_kv", s["kv_layers"])
        w.add_uint32(f"{arch}.shortconv.l_cache", s["l_cache"])
    else:
        w.add_uint32(f"{arch}.attention.head_count_kv", HKV)
    mla = s.get("mla")
    if mla:     # convert_hf_to_gguf.py's DeepseekV2Model: the cache's dims, then a head's
        w.add_uint32(f"{arch}.attention.q_lora_rank", mla["q_lora"])
        w.add_uint32(f"{arch}.attention.kv_lora_rank", mla["kv_lora"])
        w.add_uint32(f"{arch}.attention.key_length", mla["kv_lora"] + mla["rope"])
        w.add_uint32(f"{arch}.attention.value_length", mla["kv_lora"])
        w.add_uint32(f"{arch}.attention.key_length_mla", mla["nope"] + mla["rope"])
        w.add_uint32(f"{arch}.attention.value_length_mla", mla["v"])
        w.add_uint32(f"{arch}.rope.dimension_count", mla["rope"])
    elif s["head_dim"]:
        w.add_uint32(f"{arch}.attention.key_length", hd)
        w.add_uint32(f"{arch}.attention.value_length", hd)
    w.add_float32(f"{arch}.rope.freq_base", s["rope_base"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", s["eps"])
    if "sliding_window" in s:
        w.add_uint32(f"{arch}.attention.sliding_window", s["sliding_window"])
    if "yarn" in s:
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", s["yarn"][0])
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", s["yarn"][1])
        if "yarn_log_mul" in s:   # deepseek2: 0.1 * mscale_all_dim (llama.cpp's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX])
            w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", s["yarn_log_mul"])
    if "softcap" in s:
        w.add_float32(f"{arch}.final_logit_softcapping", s["softcap"])
    if "attn_softcap" in s:
        w.add_float32(f"{arch}.attn_logit_softcapping", s["attn_softcap"])
    if n_exp:
        w.add_uint32(f"{arch}.expert_count", n_exp)
        w.add_uint32(f"{arch}.expert_used_count", n_used or s["n_used"])
        if "n_ff_exp" in s:
            w.add_uint32(f"{arch}.expert_feed_forward_length", s["n_ff_exp"])
        if "n_ff_shexp" in s:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", s["n_ff_shexp"])
        for key, v in s.get("moe_keys", {}).items():
            (w.add_bool if isinstance(v, bool) else w.add_float32 if isinstance(v, float) else w.add_uint32)(
                f"{arch}.{key}", v)
    delta = s.get("delta")
    if delta:   # convert_hf_to_gguf.py's Qwen3NextModel: the ssm keys, the recurrent layers and their interval
        w.add_uint32(f"{arch}.ssm.conv_kernel", delta["conv"])
        w.add_uint32(f"{arch}.ssm.state_size", delta["head"])
        w.add_uint32(f"{arch}.ssm.group_count", delta["n_k"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", delta["n_v"])
        w.add_uint32(f"{arch}.ssm.inner_size", delta["head"] * delta["n_v"])
        w.add_array(f"{arch}.attention.recurrent_layers", [(i + 1) % 4 != 0 for i in range(s["n_layer"])])
        w.add_uint32(f"{arch}.full_attention_interval", 4)
    tokens, merges, ttypes = _vocab(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(V - 3)
    w.add_eos_token_id(V - 1)
    w.add_add_bos_token(False)

    def mat(name: str, kind: str, n_in: int, n_out: int, scale: float, n_exp: int = 0, write: bool = True):
        x = (rng.standard_normal(((n_exp,) if n_exp else ()) + (n_out, n_in)) * scale).astype(np.float32)
        if name == drop or not write:
            return x
        if kind == "ffn_gate_inp":
            w.add_tensor(name, x * (router != "zero"))
            return
        t = types.get(kind, T.F16)
        if t == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, t), raw_dtype=t)

    def vec(name: str, n: int | tuple, lo: float, hi: float):
        x = rng.uniform(lo, hi, n).astype(np.float32)
        if name != drop:
            w.add_tensor(name, x)

    # embeddings (the output too when tied: logits of std ~ scale * sqrt(n_embd)); gemma3 multiplies
    # them by sqrt(n_embd) on the way in
    mat("token_embd.weight", "token_embd", E, V, s.get("embd_std", 0.25 if arch == "gemma3" else 0.5))
    for i in range(s["n_layer"] + s.get("nextn", 0)):
        p = f"blk.{i}."
        if s.get("pre_norms", True):
            vec(p + "attn_norm.weight", E, 0.8, 1.2)
        # a recurrent layer (LFM2's short convolution, Qwen3-Next's gated DeltaNet): no attention tensors
        recr = bool(delta and (i + 1) % 4) or ("kv_layers" in s and not s["kv_layers"][i])
        if "kv_layers" in s and not s["kv_layers"][i]:   # LFM2's gated short convolution: b, c, x; taps; out
            mat(p + "shortconv.in_proj.weight", "shortconv.in_proj", E, 3 * E, 1.0 / np.sqrt(E))
            vec(p + "shortconv.conv.weight", (E, s["l_cache"]), -1.0, 1.0)    # F32 [l_cache, n_embd]
            mat(p + "shortconv.out_proj.weight", "shortconv.out_proj", E, E, RESID / np.sqrt(E))
        elif delta and (i + 1) % 4:   # a gated DeltaNet layer (llama_model_qwen3next::load_arch_tensors)
            HK, HV, SD = delta["n_k"], delta["n_v"], delta["head"]
            conv = 2 * HK * SD + HV * SD
            mat(p + "attn_qkv.weight", "attn_qkv", E, conv, 1.5 / np.sqrt(E))
            mat(p + "attn_gate.weight", "attn_gate", E, HV * SD, 1.5 / np.sqrt(E))
            mat(p + "ssm_ba.weight", "ssm_ba", E, 2 * HV, 1.0 / np.sqrt(E))
            x = (rng.standard_normal((conv, delta["conv"])) * 0.5).astype(np.float32)     # F32, as ssm_conv needs
            if p + "ssm_conv1d.weight" != drop:
                w.add_tensor(p + "ssm_conv1d.weight", x)
            vec(p + "ssm_dt.bias", HV, -1.0, 1.0)
            if p + "ssm_a" != drop:     # -exp(A_log), A_log in (ln 0.05, ln 0.5): decays of ~0.7 to 0.97 per token
                w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(np.log(0.05), np.log(0.5), HV)).astype(np.float32))
            vec(p + "ssm_norm.weight", SD, 0.8, 1.2)
            mat(p + "ssm_out.weight", "ssm_out", HV * SD, E, RESID / np.sqrt(HV * SD))
        elif mla:     # q (through its low rank), the latent and its norm, then per head attn_k_b / attn_v_b
            LQ, LKV, HK = mla["q_lora"], mla["kv_lora"], mla["nope"] + mla["rope"]
            if LQ:
                mat(p + "attn_q_a.weight", "attn_q_a", E, LQ, 1.0 / np.sqrt(E))
                vec(p + "attn_q_a_norm.weight", LQ, 0.8, 1.2)
                mat(p + "attn_q_b.weight", "attn_q_b", LQ, H * HK, 2.0 / np.sqrt(LQ))
            else:
                mat(p + "attn_q.weight", "attn_q", E, H * HK, 2.0 / np.sqrt(E))
            mat(p + "attn_kv_a_mqa.weight", "attn_kv_a_mqa", E, LKV + mla["rope"], 2.0 / np.sqrt(E))
            vec(p + "attn_kv_a_norm.weight", LKV, 0.8, 1.2)
            mat(p + "attn_k_b.weight", "attn_k_b", mla["nope"], LKV, 2.0 / np.sqrt(LKV), H)
            mat(p + "attn_v_b.weight", "attn_v_b", LKV, mla["v"], 1.0 / np.sqrt(LKV), H)
            mat(p + "attn_output.weight", "attn_output", H * mla["v"], E, RESID / np.sqrt(H * mla["v"]))
        else:   # (qwen3next: each head's query rows, then its output gate's)
            mat(p + "attn_q.weight", "attn_q", E, H * hd * (2 if delta else 1), s.get("qk_std", 2.0) / np.sqrt(E))
            mat(p + "attn_k.weight", "attn_k", E, HKV * hd, s.get("qk_std", 2.0) / np.sqrt(E))
            mat(p + "attn_v.weight", "attn_v", E, HKV * hd, 1.0 / np.sqrt(E))
        if s["bias"]:
            vec(p + "attn_q.bias", H * hd, -0.5, 0.5)
            vec(p + "attn_k.bias", HKV * hd, -0.5, 0.5)
            vec(p + "attn_v.bias", HKV * hd, -0.2, 0.2)
        if s["qk_norm"] and not recr:    # per head, or "full": over the whole projection
            vec(p + "attn_q_norm.weight", H * hd if s["qk_norm"] == "full" else hd, 0.5, 1.5)
            vec(p + "attn_k_norm.weight", HKV * hd if s["qk_norm"] == "full" else hd, 0.5, 1.5)
        if not mla and not recr:
            mat(p + "attn_output.weight", "attn_output", H * hd, E, RESID / np.sqrt(H * hd))
        if oss:   # the attention output's bias and the sinks; the FFN's norm is "post_attention_norm"
            vec(p + "attn_output.bias", E, -0.2, 0.2)
            vec(p + "attn_sinks.weight", H, 0.0, 3.0)
        if s["post_norms"]:
            vec(p + "post_attention_norm.weight", E, *s.get("post_norm", (1.5, 2.5)))
        if s.get("pre_norms", True):
            vec(p + s.get("ffn_norm", "post_attention_norm" if oss else "ffn_norm") + ".weight", E, 0.8, 1.2)
        if n_exp and i >= s.get("lead_dense", 0) and (i + 1) % s.get("moe_step", 1) == 0:
            FX = s.get("n_ff_exp", F)
            mat(p + "ffn_gate_inp.weight", "ffn_gate_inp", E, n_exp, s.get("router_scale", 3.0) / np.sqrt(E))
            fuse = s.get("gate_up", False)   # convert_hf_to_gguf.py --fuse-gate-up-exps: per expert gate, then up
            g = mat(p + "ffn_gate_exps.weight", "ffn_gate_exps", E, FX, s.get("gate_scale", 2.0) / np.sqrt(E), n_exp,
                    write=not fuse)
            u = mat(p + "ffn_up_exps.weight", "ffn_up_exps", E, FX, 1.0 / np.sqrt(E), n_exp, write=not fuse)
            if fuse:
                x = np.concatenate([g, u], axis=1)
                t = types.get("ffn_gate_exps", T.F16)
                w.add_tensor(p + "ffn_gate_up_exps.weight", x.astype(np.float16) if t == T.F16 else
                             gguf.quants.quantize(x, t), raw_dtype=None if t == T.F16 else t)
            mat(p + "ffn_down_exps.weight", "ffn_down_exps", FX, E, RESID / np.sqrt(FX), n_exp)
            if s.get("score_bias"):   # the selection's per-expert bias, of the sigmoid scores' size
                b = s["score_bias"] if isinstance(s["score_bias"], float) else 0.3
                vec(p + "exp_probs_b.bias", n_exp, -b, b)
            if oss:   # the router's and the experts' biases (one row per expert)
                vec(p + "ffn_gate_inp.bias", n_exp, -0.5, 0.5)
                for name, n, r in (("ffn_gate_exps", FX, 0.5), ("ffn_up_exps", FX, 0.5), ("ffn_down_exps", E, 0.2)):
                    x = rng.uniform(-r, r, (n_exp, n)).astype(np.float32)
                    if p + name + ".bias" != drop:
                        w.add_tensor(p + name + ".bias", x)
            if "n_ff_shexp" in s or "shexp_count" in s:   # the shared expert and its gate (sigmoid(h . g))
                FS = s.get("n_ff_shexp", FX * s.get("shexp_count", 0))
                if "n_ff_shexp" in s and s.get("shexp_gate", True):   # (DeepSeek's, GLM's, Granite's have none)
                    vec(p + "ffn_gate_inp_shexp.weight", E, -0.3, 0.3)
                mat(p + "ffn_gate_shexp.weight", "ffn_gate_shexp", E, FS, 2.0 / np.sqrt(E))
                mat(p + "ffn_up_shexp.weight", "ffn_up_shexp", E, FS, 1.0 / np.sqrt(E))
                mat(p + "ffn_down_shexp.weight", "ffn_down_shexp", FS, E, RESID / np.sqrt(FS))
        else:
            mat(p + "ffn_gate.weight", "ffn_gate", E, F, 2.0 / np.sqrt(E))
            mat(p + "ffn_up.weight", "ffn_up", E, F, 1.0 / np.sqrt(E))
            mat(p + "ffn_down.weight", "ffn_down", F, E, RESID / np.sqrt(F))
        if s["post_norms"]:
            vec(p + "post_ffw_norm.weight", E, *s.get("post_norm", (1.5, 2.5)))
        if i >= s["n_layer"]:   # a multi-token-prediction block's own tensors (llama.cpp's nextn.*)
            mat(p + "nextn.eh_proj.weight", "nextn", 2 * E, E, 1.0 / np.sqrt(2 * E))
            vec(p + "nextn.enorm.weight", E, 0.8, 1.2)
            vec(p + "nextn.hnorm.weight", E, 0.8, 1.2)
            vec(p + "nextn.shared_head_norm.weight", E, 0.8, 1.2)
    vec(s.get("output_norm", "output_norm") + ".weight", E, 0.8, 1.2)
    if s.get("rope_freqs"):   # llama 3's long-context frequency divisors, one per rotated pair
        vec("rope_freqs.weight", hd // 2, 1.0, 8.0)
    if not s["tied"]:
        mat("output.weight", "output", E, V, 6.0 / np.sqrt(E))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def golden_model(folder: Path, arch: str, variant: str) -> tuple[dict, Path]:
    """llama.cpp's golden data for ``arch``-``variant`` (tests/data/arch, tools/make_arch_golden.py) and the
    model written again into ``folder``, checked to be the very file llama.cpp ran."""
    import hashlib

    g = dict(np.load(Path(__file__).parent / "data" / "arch" / f"{arch}-{variant}.npz"))
    path = write_model(folder / f"{arch}-{variant}.gguf", arch, variant)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(g["sha256"]), "not the file llama.cpp ran"
    return g, path
