"""What differs between the architectures quantkit runs: one table row per architecture.

The layer math is written once per path kind (``quantkit.model.forward``'s batch path,
``quantkit.model.decode``'s compiled step, ``quantkit.model.reference``'s float64 forward); each of them
walks the per-layer programs (``quantkit.model.layer.Layer``) that ``layer.describe`` builds from an
``Arch`` row, the ``LlamaConfig`` and the file's tensors -- never the architecture's name. Adding an
architecture means a row here, its config reading and, at most, the ops it adds (a record in layer.py,
one implementation per path).
The facts come from llama.cpp: ``llama_model_rope_type`` (NORM vs NEOX), each architecture's ``load_arch_hparams`` / ``load_arch_tensors`` (src/models/<arch>.cpp: which keys
and tensors it reads, which are optional) and its graph (the order of norms, the activation, the
embedding and attention scales).

A layer, in the order every path runs it (the optional steps are this table's flags)::

    x = token_embd[tok]                      (* sqrtf(n_embd)             if embd_scale)
    per layer (its program: quantkit.model.layer; a MoE file's leading dense layers are dense):
      h = rmsnorm(x) * attn_norm             (h = x                       unless pre_norms)
        a recurrent layer (head_count_kv 0 when the row has ``recurrent``) runs its recurrent op instead of
        the attention below (LFM2's short convolution: quantkit.model.layer.ShortConv), then the FFN
      q, k, v = h @ attn_q/k/v               (+ attn_q/k/v.bias           when the file has them)
      q, k = per-head rmsnorm * attn_q_norm / attn_k_norm                 if qk_norm
                                             (over the whole projection   if qk_norm_full)
      q, k = rope(q, k)                      (NORM or NEOX pairs, YaRN when the file says; SWA layers use
                                              the SWA base; none on every nope_step-th layer, whose q is
                                              then times the temperature if attn_temp)
      q, k = per-head rmsnorm without a weight                            if qk_l2 (the RoPE layers)
      s = scale * q k^T                      (cap * tanh(s / cap)          if attn_softcap)
      o = softmax(s + causal [+ sliding-window or chunk (swa_chunk)] mask [, sink logit]) v
                                             (sink per head if attn_sinks)
      o = o * sigmoid(gate) @ attn_output    (gate: the second half of each head's attn_q rows if attn_gate;
                                              + attn_output.bias if attn_out_bias)
        or, on a recurrent layer of a "delta_net" row, a gated DeltaNet (quantkit.model.layer.DeltaNet): a
        short causal convolution over [q, k, v], the delta rule's state per value head, the gated output norm
        or, multi-head latent attention (mla; quantkit.model.layer.MLA): q from attn_q or attn_q_a ->
        attn_q_a_norm -> attn_q_b, keys and values from one cached latent per position (attn_kv_a_mqa,
        attn_kv_a_norm) through attn_k_b / attn_v_b, RoPE on a decoupled part of q and of the key
      o = rmsnorm(o) * post_attention_norm                                 if post_norms
      x = x + o
      h = rmsnorm(x) * ffn_norm              (gpt-oss: post_attention_norm, its Arch.ffn_norm; h = x unless
                                              pre_norms)
      f = (act(h @ ffn_gate) * (h @ ffn_up)) @ ffn_down   act = SiLU or GELU (tanh form)     dense FFN
        or, a mixture of experts (moe; llama.cpp's build_moe_ffn):
      (E, w) = route(h @ ffn_gate_inp)       quantkit.model.route: gating (softmax; sigmoid; gpt-oss's
                                             softmax of the chosen logits), score bias, expert groups, the
                                             expert_used_count largest, w normalized if moe_norm_w, scaled
      f = sum over e in E of w_e * (silu(h @ ffn_gate_exps[e]) * (h @ ffn_up_exps[e])) @ ffn_down_exps[e]
        (moe_weight_before: each expert of w_e h, unweighted; moe_select_logits: E chosen on the logits)
        (gpt-oss: each product + its expert's bias, act = swiglu_oai, moe_biases)
      f += sigmoid(h . ffn_gate_inp_shexp) * (silu(h @ ffn_gate_shexp) * (h @ ffn_up_shexp)) @ ffn_down_shexp
                                             if shared_expert (the sigmoid gate if shexp_gate)
      f = rmsnorm(f) * post_ffw_norm                                       if post_norms
      x = x + f
    logits = rmsnorm(x) * output_norm @ output   (+ output.bias; cap * tanh(logits / cap) if softcap)
"""

from __future__ import annotations

from dataclasses import dataclass


#: ``Arch.moe``: dense FFN only; experts when ``{arch}.expert_count`` > 0 (llama: Mixtral); experts always
MOE_NONE, MOE_OPTIONAL, MOE_ALWAYS = 0, 1, 2


@dataclass(frozen=True)
class Arch:
    name: str
    rope_neox: bool          # llama_model_rope_type: NEOX rotates (x[i], x[i + n_rot/2]), NORM (x[2i], x[2i+1])
    qk_norm: bool            # blk.N.attn_q_norm / attn_k_norm (head_dim), RMSNorm per head before RoPE
    post_norms: bool         # blk.N.post_attention_norm / post_ffw_norm (n_embd) before each residual add
    glu: str                 # "silu" (LLM_FFN_SILU, SwiGLU) or "gelu" (LLM_FFN_GELU, ggml's tanh GELU)
    embd_scale: bool         # embeddings times sqrtf(n_embd) (Gemma)
    swa_pattern: int         # with {arch}.attention.sliding_window > 0, layer il slides unless
                             # il % n == n - 1 (llama_hparams::set_swa_pattern); 0: the arch has no SWA
    output_bias: bool        # output.bias is read when present (qwen2)
    softcap: bool            # {arch}.final_logit_softcapping is read (gemma3)
    moe: int = MOE_NONE      # whether the FFN is a mixture of experts (quantkit.model.layer.MoeFFN)
    moe_norm_w: bool = True  # build_moe_ffn's norm_w: the chosen experts' weights divided by their sum
    shared_expert: bool = False  # blk.N.ffn_{gate,up,down}_shexp beside the routed experts
    shexp_gate: bool = True      # ... scaled by sigmoid(h . ffn_gate_inp_shexp) (qwen2moe); else added as it is
    shexp_width: str = "key_or_n_ff"  # ... of width {arch}.expert_shared_feed_forward_length, default n_ff
                                      # (qwen2moe); "n_ff_exp": an expert's (llama4);
                                      # "count": expert_feed_forward_length *
                                      # {arch}.expert_shared_count (DeepSeek, GLM); "key": that key's, 0
                                      # (no shared expert) without it (granitemoe)
    granite_scales: bool = False  # {arch}.embedding_scale, residual_scale (each block's output before its
                                  # add), attention.scale and logit_scale (the logits divided by it):
                                  # src/models/granite.cpp
    moe_gating: str = "softmax"  # build_moe_ffn's gating_op: "softmax" or "softmax_weight" (quantkit.model.layer)
    moe_biases: bool = False     # ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias (gpt-oss)
    attn_sinks: bool = False     # blk.N.attn_sinks (n_head): one more logit per head in the softmax (gpt-oss)
    attn_out_bias: bool = False  # blk.N.attn_output.bias (gpt-oss)
    ffn_norm: str = "ffn_norm"   # the FFN's input norm (gpt-oss: "post_attention_norm", its "attn_post_norm")
    swa_rope_model: bool = False  # SWA layers use the model's RoPE base (unless {arch}.rope.freq_base_swa)
                                  # and scaling (gpt-oss); else llama_hparams' 10000 and none (gemma3)
    attn_scale: str = "head_dim"  # the softmax scale of q.k: 1/sqrt(head_dim); "n_rot": 1/sqrt(n_rot)
                                  # (gpt-oss); "gemma3" / "gemma2": 1/sqrt(n_embd / n_head) for the 27B
                                  # (WIDE_SCALE_LAYERS; load_arch_hparams of each), else head_dim's
    qk_norm_optional: bool = False  # attn_q_norm / attn_k_norm read when the file has them (GLM-4.5's
                                    # 355B has them, Air does not: TENSOR_NOT_REQUIRED)
    moe_hparams: bool = False     # reads {arch}.expert_gating_func, expert_weights_norm and
                                  # expert_weights_scale (the DeepSeek V3 family's build_moe_ffn arguments)
    gating_key: bool = False      # requires {arch}.expert_gating_func (the graph passes it to build_moe_ffn,
                                  # which aborts without one: lfm2moe, minimax-m2) and reads no other MoE key
                                  # (norm_w and the scale stay the row's)
    lead_dense: bool = False      # reads {arch}.leading_dense_block_count: the first layers' FFN dense
    score_bias: bool = False      # reads blk.N.exp_probs_b (the selection's per-expert score bias) when present
    moe_step: bool = False        # requires {arch}.interleave_moe_layer_step (ERNIE 4.5; quantkit runs step 1,
                                  # the one llama.cpp's loader and graph agree on)
    nope_step: int = 0            # layer il does not rotate Q/K when (il + 1) % n == 0 (llama_hparams'
                                  # n_no_rope_layer_step, which llama.cpp sets, reading no key: SmolLM3 4)
    pre_norms: bool = True        # blk.N.attn_norm / ffn_norm before each block; False: none (OLMo 2)
    qk_norm_full: bool = False    # blk.N.attn_q_norm (n_head * head_dim) / attn_k_norm (n_head_kv * head_dim):
                                  # one RMSNorm over the whole projection before RoPE (OLMo 2), not per head
    attn_softcap: bool = False    # {arch}.attn_logit_softcapping (default 50): each scaled attention logit
                                  # s -> cap * tanh(s / cap) before the mask and softmax (Gemma 2)
    swa_default: int = 0          # the sliding window without {arch}.attention.sliding_window (Gemma 2: 4096)
    swa_rope_plain: bool = False  # SWA layers use the model's RoPE base (olmo2.cpp's graph reads no
                                  # freq_base_swa) at scale 1, without YaRN (OLMo 3's olmo2 files)
    mla: bool = False             # multi-head latent attention (quantkit.model.layer.MLA): reads
                                  # {arch}.attention.q_lora_rank / kv_lora_rank / key_length_mla /
                                  # value_length_mla and blk.N.attn_q_a ... attn_v_b instead of attn_q/k/v;
                                  # the softmax scale 1/sqrt(key_length_mla) times YaRN's mscale squared
    recurrent: str = ""           # the recurrent op of the recurrent layers (hparams.is_recr): "shortconv"
                                  # (quantkit.model.layer.ShortConv, LFM2) on the layers whose
                                  # {arch}.attention.head_count_kv entry is 0 (head_count_kv is then a
                                  # per-layer array, {arch}.shortconv.l_cache required); "delta_net"
                                  # (quantkit.model.layer.DeltaNet, Qwen3-Next) where
                                  # {arch}.attention.recurrent_layers says (else every layer but each
                                  # {arch}.full_attention_interval-th, default 4), reading {arch}.ssm.conv_kernel,
                                  # state_size, group_count, time_step_rank, inner_size
    output_norm: str = "output_norm"  # the final norm's tensor (LFM2's is "token_embd_norm":
                                      # LLM_TENSOR_OUTPUT_NORM_LFM2)
    yarn_log_mul: bool = False    # {arch}.rope.scaling.yarn_log_multiplier is 0.1 * mscale_all_dim, which
                                  # also stands for YaRN's mscale (llama.cpp's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX])
    swa_chunk: int = 0            # the sliding layers attend within chunks of this many positions
                                  # (LLAMA_SWA_TYPE_CHUNKED), whatever {arch}.attention.sliding_window says
                                  # (llama4: 8192, set by llama_model_llama4::load_arch_hparams; a file's
                                  # sliding_window 0, MobileLLM's form, is refused)
    attn_temp: tuple = ()         # the NoPE layers' query temperature (n_attn_temp_floor_scale,
                                  # f_attn_temp_scale, f_attn_temp_offset): q times log(floor((pos + offset) /
                                  # floor_scale) + 1) * scale + 1 (llm_graph_input_attn_temp; llama4)
    qk_l2: bool = False           # the RoPE layers' q and k RMS-normed per head without a weight, after RoPE
                                  # (llama4's use_kq_norm, "Llama4TextL2Norm"; not for NO_QK_L2_EXPERTS)
    swa_rope_factors: bool = False  # the sliding layers' RoPE divides by rope_freqs too (llama4: every layer
                                    # calls get_rope_factors)
    moe_interleave: bool = False  # requires {arch}.interleave_moe_layer_step n: layer il's FFN is a mixture
                                  # of experts when (il + 1) % n == 0, else dense (llama4)
    moe_weight_before: bool = False  # build_moe_ffn's weight_before_ffn: each chosen expert's weight multiplies
                                     # its input, not its output (llama4)
    moe_select_logits: bool = False  # the experts are chosen on the router's logits, not on the gated
                                     # probabilities (build_moe_ffn: llama4's selection_probs = logits)
    attn_gate: bool = False       # attn_q makes per head [query, output gate]: the attention's output times
                                  # sigmoid(gate) before attn_output (qwen3next's build_layer_attn)


#: ``Arch.attn_scale`` kinds whose models of this many layers (the 27B ones) scale q.k by 1/sqrt(n_embd /
#: n_head) instead of 1/sqrt(head_dim) (llama_model_gemma3 / llama_model_gemma2::load_arch_hparams)
WIDE_SCALE_LAYERS = {"gemma3": 62, "gemma2": 46}

#: ``Arch.qk_l2`` architectures whose models with this many experts skip the L2 q/k norm (llama4's
#: use_kq_norm is false for LLM_TYPE_17B_128E, Maverick: llama_model_llama4::load_arch_hparams)
NO_QK_L2_EXPERTS = {"llama4": 128}

#: GLU activations: the index the compiled kernels switch on ("swiglu_oai": ggml_swiglu_oai with
#: alpha 1.702, limit 7, as build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE calls it)
GLU_KINDS = ("silu", "gelu", "swiglu_oai")

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_OPTIONAL),
    Arch("qwen2", rope_neox=True, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=True, softcap=False),
    Arch("qwen3", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False),
    Arch("gemma3", rope_neox=True, qk_norm=True, post_norms=True, glu="gelu", embd_scale=True, swa_pattern=6,
         output_bias=False, softcap=True, attn_scale="gemma3"),
    Arch("qwen3moe", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS),
    # src/models/qwen2moe.cpp: qwen2's attention (Q/K/V biases), build_moe_ffn with norm_w = false, and
    # the shared expert
    Arch("qwen2moe", rope_neox=True, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, moe_norm_w=False, shared_expert=True),
    # src/models/openai-moe.cpp: sinks, the attention output's bias, every other layer sliding
    # (load_swa_pattern(2)), the FFN normed by blk.N.post_attention_norm, build_moe_ffn with the router's
    # and the experts' biases, LLM_FFN_SWIGLU_OAI_MOE, norm_w = false and SOFTMAX_WEIGHT gating
    Arch("gpt-oss", rope_neox=True, qk_norm=False, post_norms=False, glu="swiglu_oai", embd_scale=False,
         swa_pattern=2, output_bias=False, softcap=False, moe=MOE_ALWAYS, moe_norm_w=False,
         moe_gating="softmax_weight", moe_biases=True, attn_sinks=True, attn_out_bias=True,
         ffn_norm="post_attention_norm", swa_rope_model=True, attn_scale="n_rot"),
    # src/models/glm4-moe.cpp (GLM-4.5 / 4.6 / 4.7): NEOX RoPE over rope.dimension_count (partial), Q/K/V
    # biases, optional per-head Q/K norms, the FFN normed by blk.N.post_attention_norm, leading dense
    # layers, build_moe_ffn with the file's gating (sigmoid), exp_probs_b, norm_w and scale, and an ungated
    # shared expert expert_shared_count experts wide
    Arch("glm4moe", rope_neox=True, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, moe_gating="sigmoid", shared_expert=True,
         shexp_gate=False, shexp_width="count", ffn_norm="post_attention_norm", qk_norm_optional=True,
         moe_hparams=True, lead_dense=True, score_bias=True),
    # src/models/granite-moe.cpp (Granite 3.x MoE, GraniteMoeShared): llama's layer (NORM RoPE) with
    # Granite's four scales, build_moe_ffn with softmax gating and norm_w = true, experts as wide as
    # feed_forward_length, an ungated shared expert when expert_shared_feed_forward_length is set
    Arch("granitemoe", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False,
         swa_pattern=0, output_bias=False, softcap=False, moe=MOE_OPTIONAL, shared_expert=True, shexp_gate=False,
         shexp_width="key", granite_scales=True),
    # src/models/ernie4-5-moe.cpp (ERNIE 4.5 MoE): NORM RoPE, leading dense layers, build_moe_ffn with softmax
    # gating, norm_w = true and the optional score bias exp_probs_b, an ungated shared expert when
    # expert_shared_feed_forward_length is set
    Arch("ernie4_5-moe", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False,
         swa_pattern=0, output_bias=False, softcap=False, moe=MOE_ALWAYS, shared_expert=True, shexp_gate=False,
         shexp_width="key", lead_dense=True, score_bias=True, moe_step=True),
    # src/models/smollm3.cpp: llama's layer, no RoPE on every fourth (n_no_rope_layer_step 4)
    Arch("smollm3", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, nope_step=4),
    # src/models/olmo2.cpp: no input norms, RMSNorm over the whole Q and K projections, post-attention /
    # post-FFN norms; with attention.sliding_window (OLMo 3) every fourth layer global (load_swa_pattern(4))
    Arch("olmo2", rope_neox=True, qk_norm=True, post_norms=True, glu="silu", embd_scale=False, swa_pattern=4,
         output_bias=False, softcap=False, pre_norms=False, qk_norm_full=True, swa_rope_plain=True),
    # src/models/gemma2.cpp: gemma3's layer without Q/K norms, every other layer sliding (load_swa_pattern(2),
    # window 4096 by default) with the model's RoPE, attention and final logit soft-capping
    Arch("gemma2", rope_neox=True, qk_norm=False, post_norms=True, glu="gelu", embd_scale=True, swa_pattern=2,
         output_bias=False, softcap=True, swa_rope_model=True, attn_scale="gemma2", attn_softcap=True,
         swa_default=4096),
    # src/models/deepseek2.cpp (DeepSeek V2 / V2-Lite / V3, Kimi K2): MLA in its absorbed form (is_mla),
    # NORM RoPE on the decoupled part, leading dense layers, build_moe_ffn with the file's gating, norm and
    # scale, and ungated shared experts expert_shared_count experts wide
    # src/models/qwen3next.cpp (Qwen3-Next): gated DeltaNet layers (linear attention with a recurrent state)
    # between gated attention layers (per-head Q/K norms, NEOX RoPE over rope.dimension_count), the FFN
    # normed by blk.N.post_attention_norm, build_moe_ffn with softmax gating and norm_w = true, and a shared
    # expert scaled by sigmoid(h . ffn_gate_inp_shexp)
    Arch("qwen3next", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, shared_expert=True, ffn_norm="post_attention_norm",
         recurrent="delta_net", attn_gate=True),
    Arch("deepseek2", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, moe_norm_w=False, shared_expert=True, shexp_gate=False,
         shexp_width="count", moe_hparams=True, lead_dense=True, score_bias=True, mla=True,
         yarn_log_mul=True),
    # src/models/llama4.cpp (Llama 4 Scout / Maverick, text): NORM RoPE with rope_freqs on every layer, three
    # chunked layers (8192 positions) then a global one (load_swa_pattern(4)) that has no RoPE and scales q
    # by the temperature, the RoPE layers' weightless per-head q/k norm after RoPE, MoE layers every
    # interleave_moe_layer_step-th (dense ones between), build_moe_ffn with sigmoid gating chosen on the
    # logits, norm_w = false and the weight on the experts' input, and an ungated shared expert as wide as
    # an expert
    Arch("llama4", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=4,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, moe_norm_w=False, moe_gating="sigmoid",
         shared_expert=True, shexp_gate=False, shexp_width="n_ff_exp", swa_rope_model=True, nope_step=4,
         swa_chunk=8192, attn_temp=(8192, 0.1, 1.0), qk_l2=True, swa_rope_factors=True, moe_interleave=True,
         moe_weight_before=True, moe_select_logits=True),
    # src/models/minimax-m2.cpp (MiniMax-M2): NEOX RoPE over rope.dimension_count (partial), RMSNorm over the
    # whole Q and K projections before it, build_moe_ffn with the file's gating (sigmoid), the score bias
    # exp_probs_b and norm_w = true
    Arch("minimax-m2", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, moe=MOE_ALWAYS, qk_norm_full=True, score_bias=True, gating_key=True),
    # src/models/lfm2.cpp (LFM2): gated short-convolution layers (head_count_kv 0) between attention layers
    # with per-head Q/K norms and NEOX RoPE, every layer's FFN a dense SwiGLU, the final norm token_embd_norm
    Arch("lfm2", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, recurrent="shortconv", output_norm="token_embd_norm"),
    # src/models/lfm2moe.cpp (LFM2-MoE, LFM2-8B-A1B): LFM2's layers and graph, the FFN a mixture of experts past
    # the leading dense layers: build_moe_ffn with the file's gating (sigmoid), norm_w = true, no scale
    # (expert_weights_scale is not read) and the required score bias exp_probs_b
    Arch("lfm2moe", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False, recurrent="shortconv", output_norm="token_embd_norm", moe=MOE_ALWAYS,
         gating_key=True, lead_dense=True, score_bias=True),
)}

SUPPORTED_ARCHS = tuple(ARCHS)

#: mixture-of-experts architectures llama.cpp runs and quantkit does not yet: what each one lacks here
UNSUPPORTED_MOE_ARCHS = {
    "deepseek": "the shared experts (ffn_*_shexp) and leading dense layers",
    "olmoe": "the whole-Q/K RMSNorm",
}

#: tensors llama.cpp may read for these architectures that quantkit does not apply: a file that has one
#: is refused rather than run without it (suffixes after ``blk.N.``)
UNSUPPORTED_LAYER_TENSORS = ("attn_qkv.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                             "ffn_down.bias")
#: the shared expert's tensors (``Arch.shared_expert``)
SHEXP_TENSORS = ("ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
#: the router's and the experts' biases (``Arch.moe_biases``)
MOE_BIAS_TENSORS = ("ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias")
#: tensors of MoE layers llama.cpp may read (shared experts, expert biases) that quantkit does not apply
#: unless the architecture's row says it reads them: a file with one is refused
UNSUPPORTED_MOE_TENSORS = SHEXP_TENSORS + MOE_BIAS_TENSORS + ("exp_probs_b.bias",)
