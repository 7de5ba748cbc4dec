"""The ``llama`` architecture: its config from GGUF metadata and its weights, still quantized and mapped.

Config comes from the ``llama.*`` keys alone (tinygrad / llama3.np style), with the fallbacks
llama.cpp uses when a key is absent. Weights are attributes named after the GGUF tensors
(``token_embd``, ``blk[i].attn_q`` ... ``output``), each a ``Weight``: the tensor's zero-copy uint8 rows
and its ggml type, never dequantized here. ``output`` is ``token_embd`` itself when the file has no
``output.weight`` (tied embeddings, as SmolLM2).

GGUF's llama convention: the converter permutes the Q and K rows of HF checkpoints so that RoPE in a
GGUF file rotates *adjacent* pairs (x[2i], x[2i+1]) -- llama.cpp's rope type NORM (0).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from quantkit.errors import ModelError
from quantkit.formats.gguf_io import GGUFModel
from quantkit.model.arch import (ARCHS, MOE_ALWAYS, MOE_BIAS_TENSORS, MOE_NONE, SHEXP_TENSORS, SUPPORTED_ARCHS,
                                 UNSUPPORTED_LAYER_TENSORS, UNSUPPORTED_MOE_ARCHS, UNSUPPORTED_MOE_TENSORS,
                                 NO_QK_L2_EXPERTS, WIDE_SCALE_LAYERS, Arch)
from quantkit.model.layer import Layer, MoeFFN, describe



@dataclass(frozen=True)
class LlamaConfig:
    arch: Arch              # general.architecture's row of quantkit.model.arch.ARCHS
    n_layer: int            # {arch}.block_count
    n_embd: int             # {arch}.embedding_length
    n_ff: int               # {arch}.feed_forward_length
    n_head: int             # {arch}.attention.head_count
    n_head_kv: int          # {arch}.attention.head_count_kv (default: n_head, i.e. no GQA)
    head_dim: int           # {arch}.attention.key_length (default n_embd / n_head; = value_length)
    n_rot: int              # {arch}.rope.dimension_count (default: head_dim)
    rms_eps: float          # {arch}.attention.layer_norm_rms_epsilon (default 1e-5)
    rope_freq_base: float   # {arch}.rope.freq_base (default 10000)
    rope_freq_scale: float  # 1 / {arch}.rope.scaling.factor for linear scaling (default 1)
    n_ctx_train: int        # {arch}.context_length (default 2048)
    n_vocab: int            # {arch}.vocab_size or len(tokenizer.ggml.tokens) or token_embd rows
    n_swa: int = 0          # {arch}.attention.sliding_window (0: every layer attends to the whole context)
    swa_layers: tuple = ()  # per layer: True where it slides (empty: none)
    rope_freq_base_swa: float = 10000.0   # {arch}.rope.freq_base_swa (llama_hparams' default 10000)
    attn_scale: float = 0.0               # softmax scale of q.k (0: 1 / sqrt(head_dim))
    embd_scale: float = 1.0               # sqrtf(n_embd) when the arch scales its embeddings
    softcap: float = 0.0                  # {arch}.final_logit_softcapping (0: none)
    n_expert: int = 0                     # {arch}.expert_count (0: a dense FFN)
    n_expert_used: int = 0                # {arch}.expert_used_count
    n_ff_exp: int = 0                     # one expert's width: {arch}.expert_feed_forward_length (qwen3moe;
                                          # default n_ff / n_expert_used), n_ff for llama (Mixtral)
    n_ff_shexp: int = 0                   # the shared expert's width: {arch}.expert_shared_feed_forward_length
                                          # (default n_ff) when the arch has one (qwen2moe)
    rope_freq_scale_swa: float = 1.0      # the sliding layers' RoPE scale (gpt-oss: the model's)
    yarn: bool = False                    # {arch}.rope.scaling.type "yarn": ext_factor 1 (llama_context)
    n_ctx_orig_yarn: int = 0              # {arch}.rope.scaling.original_context_length (default n_ctx_train)
    rope_mscale: float = 1.0              # YaRN: cos and sin times this (yarn_attn_factor * (1 + 0.1 ln(1 /
                                          # freq_scale)), ggml's rope_yarn)
    # build_moe_ffn's arguments that ``Arch.moe_hparams`` architectures read from the file (llama_hparams)
    moe_gating: str = "softmax"           # {arch}.expert_gating_func (1 softmax, 2 sigmoid, 3 softmax_weight;
                                          # default: the arch row's moe_gating)
    moe_norm_w: bool = True               # {arch}.expert_weights_norm (default: the arch row's moe_norm_w)
    expert_weights_scale: float = 0.0     # {arch}.expert_weights_scale (0: none)
    n_expert_groups: int = 1              # {arch}.expert_group_count (read for every arch; <= 1: no groups)
    n_group_used: int = 1                 # {arch}.expert_group_used_count
    n_layer_dense_lead: int = 0           # {arch}.leading_dense_block_count: the first layers' FFN is dense
    residual_scale: float = 0.0           # {arch}.residual_scale: each block's output times it (0: none)
    logit_scale: float = 0.0              # {arch}.logit_scale: the logits divided by it (0: none)
    attn_softcap: float = 0.0             # {arch}.attn_logit_softcapping when the arch reads it (0: none)
    yarn_swa: bool = True                 # YaRN (when the model has it) also in the sliding layers' RoPE
    # multi-head latent attention (``Arch.mla``; quantkit.model.layer.MLA): head_dim is then a query head's
    # key_length_mla (n_rot of it rotated), head_dim_v its value_length_mla
    n_lora_q: int = 0                     # {arch}.attention.q_lora_rank (0: q straight from attn_q)
    n_lora_kv: int = 0                    # {arch}.attention.kv_lora_rank (0: no MLA)
    head_dim_v: int = 0                   # {arch}.attention.value_length_mla (0: head_dim)
    # Llama 4 (the Arch row's swa_chunk, attn_temp, qk_l2, swa_rope_factors, moe_interleave)
    swa_chunked: bool = False             # the sliding layers attend within chunks of n_swa positions
    attn_temp: tuple = ()                 # the NoPE layers' query temperature (floor scale, scale, offset)
    qk_l2: bool = False                   # the RoPE layers' weightless per-head q/k RMSNorm after RoPE
    rope_factors_swa: bool = False        # rope_freqs also divides the sliding layers' RoPE
    moe_layer_step: int = 1               # {arch}.interleave_moe_layer_step: layer il (past the leading dense
                                          # ones) has experts when il + 1 is a multiple of it (0: none has)
    # recurrent layers (``Arch.recurrent``; quantkit.model.layer's "Recurrent ops")
    recurrent_layers: tuple = ()          # per layer: True where it runs the row's recurrent op (is_recr): LFM2's
                                          # head_count_kv 0, Qwen3-Next's attention.recurrent_layers
    l_cache: int = 0                      # {arch}.shortconv.l_cache: the short convolution's width
    # gated DeltaNet (``Arch.recurrent`` "delta_net"; quantkit.model.layer.DeltaNet): llama_model_qwen3next's hparams
    ssm_d_conv: int = 0                   # {arch}.ssm.conv_kernel: the convolution's taps
    ssm_d_state: int = 0                  # {arch}.ssm.state_size: a key (and value) head's dims
    ssm_n_group: int = 0                  # {arch}.ssm.group_count: key heads
    ssm_dt_rank: int = 0                  # {arch}.ssm.time_step_rank: value heads

    def is_recurrent(self, layer: int) -> bool:
        """Whether layer ``layer`` runs the row's recurrent op (llama_hparams::is_recr)."""
        return bool(self.recurrent_layers) and bool(self.recurrent_layers[layer])

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def is_swa(self, layer: int) -> bool:
        return bool(self.swa_layers) and bool(self.swa_layers[layer])

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer``'s FFN is a mixture of experts (the file's tensors then say which)."""
        return bool(self.n_expert) and layer >= self.n_layer_dense_lead and self.moe_layer_step > 0 and \
            (layer + 1) % self.moe_layer_step == 0

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], n_vocab_tensor: int | None = None, where: str = "") -> "LlamaConfig":
        at = f"{where}: " if where else ""
        name = str(meta.get("general.architecture", ""))
        if name in UNSUPPORTED_MOE_ARCHS:
            raise ModelError(f"{at}architecture {name!r} (mixture of experts) is not supported: quantkit does not "
                             f"have {UNSUPPORTED_MOE_ARCHS[name]} yet")
        if name not in ARCHS:
            raise ModelError(f"{at}architecture {name or '(none)'!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        spec = ARCHS[name]
        arch = name

        def need(key: str) -> int:
            full = f"{arch}.{key}"
            if full not in meta:
                raise ModelError(f"{at}metadata key {full!r} is missing")
            return _int(meta[full], full, at)

        def opt(key: str, default):
            return meta.get(f"{arch}.{key}", default)

        # the last {arch}.nextn_predict_layers blocks are multi-token-prediction layers, which llama.cpp's
        # text graph does not run (llama_hparams::n_layer(): n_layer_all - n_layer_nextn)
        n_all = need("block_count")
        n_nextn = _int(opt("nextn_predict_layers", 0), f"{arch}.nextn_predict_layers", at)
        if not 0 <= n_nextn < n_all:
            raise ModelError(f"{at}{arch}.nextn_predict_layers {n_nextn} must be in 0..{n_all - 1}")
        n_layer = n_all - n_nextn
        sections = opt("rope.dimension_sections", None)
        if sections is not None and any(int(v) for v in sections):
            raise ModelError(f"{at}{arch}.rope.dimension_sections: multimodal RoPE (M-RoPE) is not supported")
        n_embd = need("embedding_length")
        n_expert = _int(opt("expert_count", 0), f"{arch}.expert_count", at) if spec.moe != MOE_NONE else 0
        if spec.moe == MOE_ALWAYS and n_expert <= 0:
            raise ModelError(f"{at}metadata key {arch}.expert_count must be positive for {arch}")
        n_expert_used = _int(opt("expert_used_count", 0), f"{arch}.expert_used_count", at) if n_expert > 0 else 0
        if n_expert > 0 and not 0 < n_expert_used <= n_expert:
            raise ModelError(f"{at}metadata key {arch}.expert_used_count = {n_expert_used} must be in 1..{n_expert}")
        n_ff_exp_key = f"{arch}.expert_feed_forward_length"
        n_ff = need("feed_forward_length") if not (n_expert and n_ff_exp_key in meta) else \
            _int(opt("feed_forward_length", 0), f"{arch}.feed_forward_length", at)
        n_ff_exp = 0
        if n_expert:
            n_ff_exp = _int(meta[n_ff_exp_key], n_ff_exp_key, at) if spec.moe == MOE_ALWAYS and n_ff_exp_key in meta \
                else (n_ff // n_expert_used if spec.moe == MOE_ALWAYS else n_ff)
            if n_ff_exp <= 0:
                raise ModelError(f"{at}the experts' feed-forward length {n_ff_exp} must be positive")
        n_ff_shexp = 0
        if n_expert and spec.shared_expert and spec.shexp_width == "count":
            # llama_model_deepseek2 / glm4_moe::load_arch_tensors: n_ff_exp * n_expert_shared (0: none)
            n_ff_shexp = n_ff_exp * _int(opt("expert_shared_count", 0), f"{arch}.expert_shared_count", at)
        elif n_expert and spec.shared_expert and spec.shexp_width == "n_ff_exp":   # llama4: an expert's width
            n_ff_shexp = n_ff_exp
        elif n_expert and spec.shared_expert and spec.shexp_width == "key":   # granite_moe: 0 without the key
            n_ff_shexp = _int(opt("expert_shared_feed_forward_length", 0), f"{arch}.expert_shared_feed_forward_length",
                              at)
        elif n_expert and spec.shared_expert:   # llama_model_qwen2moe::load_arch_tensors: default n_ff
            n_ff_shexp = _int(opt("expert_shared_feed_forward_length", 0), f"{arch}.expert_shared_feed_forward_length",
                              at) or n_ff
            if n_ff_shexp <= 0:
                raise ModelError(f"{at}the shared expert's feed-forward length {n_ff_shexp} must be positive")
        n_head = need("attention.head_count")
        kv_key = f"{arch}.attention.head_count_kv"
        recurrent: tuple = ()
        if spec.recurrent == "shortconv":       # LFM2: head_count_kv per layer, 0 where recurrent
            n_head_kv, recurrent = _recurrent_layers(spec, meta, n_layer, at)
        else:
            n_head_kv = _int(opt("attention.head_count_kv", n_head), kv_key, at)
        for key, v in (("block_count", n_layer), ("embedding_length", n_embd),
                       ("feed_forward_length", n_ff if not n_ff_exp else 1),
                       ("attention.head_count", n_head), ("attention.head_count_kv", n_head_kv)):
            if v <= 0:
                raise ModelError(f"{at}metadata key {arch}.{key} = {v} must be positive")
        if f"{arch}.attention.key_length" not in meta and n_embd % n_head:
            raise ModelError(f"{at}{arch}.embedding_length {n_embd} is not a multiple of head_count {n_head}")
        head_dim = _int(opt("attention.key_length", n_embd // n_head), f"{arch}.attention.key_length", at)
        head_dim_v = _int(opt("attention.value_length", head_dim), f"{arch}.attention.value_length", at)
        mla = _mla_hparams(spec, meta, at) if spec.mla else {}
        if mla:     # a query head's and a value head's dims after attn_k_b / attn_v_b
            head_dim, head_dim_v = mla.pop("head_dim"), mla["head_dim_v"]
        elif head_dim <= 0 or head_dim_v != head_dim:
            raise ModelError(f"{at}attention key length {head_dim} and value length {head_dim_v} differ: "
                             f"not supported")
        if n_head % n_head_kv:
            raise ModelError(f"{at}head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
        n_rot = _int(opt("rope.dimension_count", head_dim), f"{arch}.rope.dimension_count", at)
        rot_max = head_dim - 1 if mla else head_dim     # MLA: at least one dim without RoPE (n_embd_head_qk_nope)
        if n_rot <= 0 or n_rot > rot_max or n_rot % 2:
            raise ModelError(f"{at}{arch}.rope.dimension_count {n_rot} must be even and in 2..{rot_max}")
        scaling = str(opt("rope.scaling.type", "none"))
        factor = float(opt("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear", "yarn") and factor not in (0.0, 1.0):
            raise ModelError(f"{at}rope scaling {scaling!r} is not supported (only linear and yarn)")
        freq_scale = 1.0 / factor if scaling in ("linear", "yarn") and factor > 0 else 1.0
        yarn = scaling == "yarn"
        rope_mscale = 1.0
        f32 = np.float32
        # deepseek2's {arch}.rope.scaling.yarn_log_multiplier is 0.1 * mscale_all_dim ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]:
        # llama_model_deepseek2::load_arch_hparams divides it by 0.1)
        log_mul = f32(opt("rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / f32(0.1) if spec.yarn_log_mul else f32(0)
        if yarn:
            # llama_context: yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) * rope.scaling.attn_factor;
            # ggml's rope_yarn then multiplies by 1 + 0.1 ln(1 / freq_scale). In float32, as both do. With
            # deepseek2's log_mul the first factor is get_mscale(factor, log_mul) / get_mscale(factor, log_mul) = 1
            # (its mscale is mscale_all_dim), so the rotation's magnitude is 1 and the softmax scale takes it.
            fct = f32(1.0) / f32(freq_scale)
            ms = f32(1.0) if fct <= 1.0 or log_mul else f32(0.1) * np.log(fct) + f32(1.0)
            attn = ms * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(fct)))
            attn = attn * f32(opt("rope.scaling.attn_factor", 1.0))
            rope_mscale = float(attn * (f32(1.0) + f32(0.1) * np.log(f32(1.0) / f32(freq_scale))))

        # sliding-window attention (llama_model_gemma3::load_arch_hparams, load_swa_pattern)
        n_swa = _int(opt("attention.sliding_window", spec.swa_default), f"{arch}.attention.sliding_window", at) \
            if spec.swa_pattern else 0
        if spec.swa_chunk:   # llama_model_llama4::load_arch_hparams: the chunk is its own, not the file's
            if n_swa == 0 and f"{arch}.attention.sliding_window" in meta:
                raise ModelError(f"{at}{arch}.attention.sliding_window 0 (every layer global, MobileLLM's form) is "
                                 f"not supported: quantkit runs {arch}'s chunked attention")
            n_swa = spec.swa_chunk
        swa_layers: tuple = ()
        if n_swa > 0:
            pattern = opt("attention.sliding_window_pattern", spec.swa_pattern)
            if isinstance(pattern, (list, tuple)):
                if len(pattern) < n_layer:
                    raise ModelError(f"{at}{arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                                     f"for {n_layer} layers")
                swa_layers = tuple(bool(p) for p in pattern[:n_layer])
            else:
                n_pat = _int(pattern, f"{arch}.attention.sliding_window_pattern", at)
                swa_layers = tuple(n_pat == 0 or il % n_pat < n_pat - 1 for il in range(n_layer))
        else:
            n_swa = 0
        # the softmax scale (Arch.attn_scale): 1/sqrt(head_dim) unless the row says otherwise
        attn_scale = 1.0 / math.sqrt(n_embd // n_head) if WIDE_SCALE_LAYERS.get(spec.attn_scale) == n_layer else \
            1.0 / math.sqrt(n_rot) if spec.attn_scale == "n_rot" else 0.0
        if mla:
            # llama_model_deepseek2's graph: YaRN's magnitude before ggml's factor (attn_factor_org), times
            # 1 + 0.1 log_mul ln(1 / freq_scale), squared, over sqrt(key_length_mla)
            org = f32(rope_mscale) if yarn else f32(1.0) + f32(0.1) * np.log(f32(1.0) / f32(freq_scale))
            m = org * (f32(1.0) + f32(0.1) * log_mul * np.log(f32(1.0) / f32(freq_scale)))
            attn_scale = float(f32(1.0) * m * m / np.sqrt(f32(head_dim)))
        moe = _moe_hparams(spec, meta, n_expert, n_layer, at) if n_expert else {}
        ssm = _ssm_hparams(spec, meta, n_layer, at) if spec.recurrent == "delta_net" else {}
        if ssm:     # Qwen3-Next: attention.recurrent_layers, or every full_attention_interval-th layer attends
            recurrent = ssm.pop("recurrent_layers")
        scales: dict[str, float] = {}
        if spec.granite_scales:   # llama_model_granite_moe::load_arch_hparams (logit_scale required)
            if f"{arch}.logit_scale" not in meta:
                raise ModelError(f"{at}metadata key {arch + '.logit_scale'!r} is missing")
            scales = {"logit_scale": float(meta[f"{arch}.logit_scale"]),
                      "residual_scale": float(opt("residual_scale", 0.0) or 0.0)}
            if float(opt("attention.scale", 0.0) or 0.0):
                attn_scale = float(opt("attention.scale", 0.0))
        l_cache = 0
        if spec.recurrent == "shortconv":   # llama_model_lfm2::load_arch_hparams (build_shortconv_block: > 1)
            l_cache = need("shortconv.l_cache")
            if l_cache < 2:
                raise ModelError(f"{at}{arch}.shortconv.l_cache {l_cache} must be at least 2")
        if spec.recurrent and _int(opt("attention.sliding_window", 0) or 0, f"{arch}.attention.sliding_window", at):
            raise ModelError(f"{at}{arch}.attention.sliding_window: {arch} with sliding-window attention layers "
                             f"is not supported")
        n_ctx_train = _int(opt("context_length", 2048), f"{arch}.context_length", at)
        base = float(opt("rope.freq_base", 10000.0))

        n_vocab = meta.get(f"{arch}.vocab_size")
        if n_vocab is None and "tokenizer.ggml.tokens" in meta:
            n_vocab = len(meta["tokenizer.ggml.tokens"])
        if n_vocab is None:
            n_vocab = n_vocab_tensor
        if n_vocab is None:
            raise ModelError(f"{at}cannot tell the vocabulary size ({arch}.vocab_size, tokenizer.ggml.tokens "
                             f"and token_embd.weight are all missing)")
        return cls(
            arch=spec, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_rot=n_rot,
            rms_eps=float(opt("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_freq_base=base,
            rope_freq_scale=freq_scale,
            n_ctx_train=n_ctx_train,
            n_vocab=_int(n_vocab, "vocab size", at),
            n_swa=n_swa, swa_layers=swa_layers,
            rope_freq_base_swa=base if spec.swa_rope_plain else
            float(opt("rope.freq_base_swa", base if spec.swa_rope_model else 10000.0)),
            rope_freq_scale_swa=freq_scale if spec.swa_rope_model else 1.0,
            yarn=yarn, rope_mscale=rope_mscale, yarn_swa=not spec.swa_rope_plain,
            n_ctx_orig_yarn=_int(opt("rope.scaling.original_context_length", n_ctx_train) or n_ctx_train,
                                 f"{arch}.rope.scaling.original_context_length", at),
            attn_scale=attn_scale,
            embd_scale=float(np.sqrt(np.float32(n_embd))) if spec.embd_scale else
            float(opt("embedding_scale", 0.0) or 1.0) if spec.granite_scales else 1.0,
            softcap=float(opt("final_logit_softcapping", 0.0) or 0.0) if spec.softcap else 0.0,
            n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp, **moe, **scales, **mla,
            attn_softcap=float(opt("attn_logit_softcapping", 50.0) or 0.0) if spec.attn_softcap else 0.0,
            swa_chunked=bool(spec.swa_chunk), attn_temp=spec.attn_temp, rope_factors_swa=spec.swa_rope_factors,
            qk_l2=spec.qk_l2 and NO_QK_L2_EXPERTS.get(name) != n_expert,
            recurrent_layers=recurrent, l_cache=l_cache, **ssm,
        )


def _recurrent_layers(spec: Arch, meta: dict[str, Any], n_layer: int, at: str) -> tuple[int, tuple]:
    """A hybrid file's attention heads and which layers are recurrent: {arch}.attention.head_count_kv per
    layer (an array; a layer with 0 KV heads is recurrent: llama_model_lfm2::load_arch_hparams' is_recr),
    or one number for every layer (none recurrent). quantkit's attention has one KV head count: every
    attention layer's must be the same."""
    key = f"{spec.name}.attention.head_count_kv"
    v = meta.get(key)
    if v is None:
        raise ModelError(f"{at}metadata key {key!r} is missing")
    per = [_int(x, key, at) for x in v] if isinstance(v, (list, tuple, np.ndarray)) else [_int(v, key, at)] * n_layer
    if len(per) < n_layer:
        raise ModelError(f"{at}{key} has {len(per)} entries for {n_layer} layers")
    per = per[:n_layer]
    heads = sorted({h for h in per if h})
    if len(heads) > 1:
        raise ModelError(f"{at}{key}: attention layers with different KV head counts {heads} are not supported")
    if min(per) < 0:
        raise ModelError(f"{at}{key} must not be negative")
    return (heads[0] if heads else 1), tuple(h == 0 for h in per)


def _ssm_hparams(spec: Arch, meta: dict[str, Any], n_layer: int, at: str) -> dict[str, Any]:
    """Gated DeltaNet's dims and which layers are DeltaNet layers (llama_model_qwen3next::load_arch_hparams):
    {arch}.attention.recurrent_layers when the file has it, else every layer but each
    {arch}.full_attention_interval-th (default 4). Keys and values have one head size (ssm.state_size; llama.cpp
    asserts S_k == S_v), inner_size is time_step_rank of them, value heads a multiple of key heads."""
    arch = spec.name

    def need(k: str) -> int:
        if f"{arch}.{k}" not in meta:
            raise ModelError(f"{at}metadata key {arch + '.' + k!r} is missing")
        v = _int(meta[f"{arch}.{k}"], f"{arch}.{k}", at)
        if v <= 0:
            raise ModelError(f"{at}metadata key {arch}.{k} = {v} must be positive")
        return v

    out = dict(ssm_d_conv=need("ssm.conv_kernel"), ssm_d_state=need("ssm.state_size"),
               ssm_n_group=need("ssm.group_count"), ssm_dt_rank=need("ssm.time_step_rank"))
    inner = need("ssm.inner_size")
    if inner != out["ssm_d_state"] * out["ssm_dt_rank"] or out["ssm_dt_rank"] % out["ssm_n_group"]:
        raise ModelError(f"{at}{arch}.ssm.inner_size {inner} must be ssm.state_size {out['ssm_d_state']} times "
                         f"ssm.time_step_rank {out['ssm_dt_rank']}, a multiple of ssm.group_count {out['ssm_n_group']}")
    flags = meta.get(f"{arch}.attention.recurrent_layers")
    if flags is not None:
        if len(flags) < n_layer:
            raise ModelError(f"{at}{arch}.attention.recurrent_layers has {len(flags)} entries for {n_layer} layers")
        recr = tuple(bool(f) for f in flags[:n_layer])
    else:
        every = _int(meta.get(f"{arch}.full_attention_interval", 4), f"{arch}.full_attention_interval", at)
        if every <= 0:
            raise ModelError(f"{at}{arch}.full_attention_interval {every} must be positive")
        recr = tuple((i + 1) % every != 0 for i in range(n_layer))
    return dict(out, recurrent_layers=recr)


def _mla_hparams(spec: Arch, meta: dict[str, Any], at: str) -> dict[str, Any]:
    """Multi-head latent attention's dims (llama_model_deepseek2::load_arch_hparams): the ranks, and a
    query head's and a value head's dims after attn_k_b / attn_v_b (key_length_mla, value_length_mla).
    The file's key_length / value_length are the cache's (kv_lora_rank + n_rot, kv_lora_rank: llama.cpp's
    MQA view). A file without key_length_mla is of the legacy form, one attn_kv_b per layer, which
    llama.cpp runs without the absorption: refused."""
    arch = spec.name

    def key(k: str, default=None):
        v = meta.get(f"{arch}.{k}", default)
        return v if v is None else _int(v, f"{arch}.{k}", at)

    if key("attention.key_length_mla") is None or key("attention.value_length_mla") is None:
        raise ModelError(f"{at}{arch}.attention.key_length_mla / value_length_mla are missing: the legacy MLA "
                         f"form (blk.N.attn_kv_b, not split) is not supported; convert the model again with "
                         f"llama.cpp's convert_hf_to_gguf.py, which writes attn_k_b and attn_v_b")
    kv = key("attention.kv_lora_rank")
    if kv is None:
        raise ModelError(f"{at}metadata key '{arch}.attention.kv_lora_rank' is missing")
    out = dict(n_lora_q=key("attention.q_lora_rank", 0), n_lora_kv=kv, head_dim=key("attention.key_length_mla"),
               head_dim_v=key("attention.value_length_mla"))
    if min(out.values()) < 0 or min(kv, out["head_dim"], out["head_dim_v"]) <= 0:
        raise ModelError(f"{at}{arch}: the MLA dims {out} must be positive (q_lora_rank may be 0)")
    n_rot = key("rope.dimension_count")
    want = {"key_length": kv + (n_rot or 0), "value_length": kv}
    for k, v in want.items():
        got = key(f"attention.{k}")
        if n_rot is not None and got is not None and got != v:
            raise ModelError(f"{at}{arch}.attention.{k} is {got}: an MLA file's is {v} (kv_lora_rank {kv}"
                             f"{f' + rope.dimension_count {n_rot}' if k == 'key_length' else ''})")
    return out


#: llama_expert_gating_func_type's values (src/llama-hparams.h) as quantkit.model.layer.GATINGS names
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def _moe_hparams(spec: Arch, meta: dict[str, Any], n_expert: int, n_layer: int, at: str) -> dict[str, Any]:
    """The routing's hyperparameters of a MoE file: the arch row's gating and norm_w, and the expert
    groups (llama_model_loader reads {arch}.expert_group_count / _used_count for every arch); for an
    ``Arch.moe_hparams`` row also the keys that override them and the weight scale (``gating_key``: the
    gating alone), for ``lead_dense``
    the leading dense layers, for ``moe_step`` the MoE layers' interleave. Each checked as
    llama_model::load_hparams asserts it."""
    arch = spec.name

    def key(k: str, default):
        return meta.get(f"{arch}.{k}", default)

    out: dict[str, Any] = {"moe_gating": spec.moe_gating, "moe_norm_w": spec.moe_norm_w}
    groups = _int(key("expert_group_count", 0), f"{arch}.expert_group_count", at)
    used = _int(key("expert_group_used_count", 0), f"{arch}.expert_group_used_count", at)
    if groups > 1:
        if n_expert % groups or not 0 < used < groups:
            raise ModelError(f"{at}{arch}.expert_group_count {groups} must divide expert_count {n_expert} and "
                             f"expert_group_used_count {used} must be in 1..{groups - 1}")
        out.update(n_expert_groups=groups, n_group_used=used)
    if spec.moe_hparams or spec.gating_key:
        full = f"{arch}.expert_gating_func"
        if spec.gating_key and full not in meta:   # llama_model_lfm2moe / _minimax_m2: no default gating
            raise ModelError(f"{at}metadata key {full!r} is missing (llama.cpp's {arch} graph has no default gating)")
        func = _int(key("expert_gating_func", 0), full, at)
        if (func or spec.gating_key) and func not in GATING_FUNCS:
            raise ModelError(f"{at}{full} = {func} is not supported (quantkit runs "
                             f"{', '.join(f'{k} ({v})' for k, v in GATING_FUNCS.items())})")
        out.update(moe_gating=GATING_FUNCS.get(func, spec.moe_gating))
    if spec.moe_hparams:
        out.update(moe_norm_w=bool(key("expert_weights_norm", False)),
                   expert_weights_scale=float(key("expert_weights_scale", 0.0) or 0.0))
    if spec.lead_dense:
        lead = _int(key("leading_dense_block_count", 0), f"{arch}.leading_dense_block_count", at)
        if not 0 <= lead <= n_layer:
            raise ModelError(f"{at}{arch}.leading_dense_block_count {lead} must be in 0..{n_layer}")
        out.update(n_layer_dense_lead=lead)
    if spec.moe_interleave:     # llama_model_llama4::load_arch_hparams (required)
        full = f"{arch}.interleave_moe_layer_step"
        if full not in meta:
            raise ModelError(f"{at}metadata key {full!r} is missing")
        step = _int(meta[full], full, at)
        if step < 0:
            raise ModelError(f"{at}{full} = {step} must not be negative")
        out.update(moe_layer_step=step)
    if spec.moe_step:
        full = f"{arch}.interleave_moe_layer_step"
        if full not in meta:
            raise ModelError(f"{at}metadata key {full!r} is missing")
        if _int(meta[full], full, at) != 1:
            raise ModelError(f"{at}{full} = {meta[full]}: only 1 (every layer past the dense ones a MoE layer) is "
                             f"supported")
    return out


def _int(v: Any, key: str, at: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ModelError(f"{at}metadata key {key!r} = {v!r} is not an integer") from None


#: llama_hparams' YaRN defaults (no GGUF key is read for them)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


def yarn_ramp(c: LlamaConfig, base: float) -> np.ndarray | None:
    """YaRN's extrapolation mix per rotated pair i (float32 (n_rot/2,)), or None without YaRN: ggml's
    ``rope_yarn_ramp(corr_dims, 2i) * ext_factor`` (ext_factor 1), the correction dims from
    ``ggml_rope_yarn_corr_dims(n_rot, n_ctx_orig, base, beta_fast 32, beta_slow 1)``. A pair's angle is
    then ``theta_interp * (1 - ramp) + theta_extrap * ramp`` (theta_interp = freq_scale * theta_extrap)."""
    if not c.yarn:
        return None
    f32 = np.float32

    def corr_dim(n_rot_: float) -> np.float32:
        return f32(c.n_rot) * np.log(f32(c.n_ctx_orig_yarn) / (f32(n_rot_) * f32(2.0) * f32(math.pi))) \
            / (f32(2.0) * np.log(f32(base)))

    low = max(f32(0.0), np.floor(corr_dim(YARN_BETA_FAST)))
    high = min(f32(c.n_rot - 1), np.ceil(corr_dim(YARN_BETA_SLOW)))
    y = (np.arange(c.n_rot // 2, dtype=np.float32) - low) / max(f32(0.001), f32(high - low))
    return (f32(1.0) - np.minimum(f32(1.0), np.maximum(f32(0.0), y))).astype(np.float32)


@dataclass(frozen=True)
class Weight:
    """One tensor as the kernels take it: ``data`` uint8 (n_rows, row_bytes), memory-mapped."""

    name: str                       # the GGUF tensor name, e.g. "blk.0.attn_q.weight"
    type: GGMLQuantizationType
    shape: tuple[int, ...]          # GGUF order: (n_in, n_out) for a matrix
    data: np.ndarray

    @property
    def n_in(self) -> int:
        return self.shape[0]

    @property
    def n_out(self) -> int:
        return self.data.shape[0]

    @property
    def n_expert(self) -> int:
        """The number of experts of a 3D ``_exps`` tensor (GGUF shape (n_in, n_out, n_expert)); 1 for a matrix."""
        return self.shape[2] if len(self.shape) == 3 else 1

    def expert(self, e: int) -> "Weight":
        """Expert ``e`` of a 3D ``_exps`` tensor -- or head ``e`` of MLA's per-head attn_k_b / attn_v_b -- as
        a matrix: a view of its rows in the map (ggml's mul_mat_id, or mul_mat over a 3D tensor, reads one 2D
        slice per expert or head; nothing is copied)."""
        n = self.shape[1]
        return Weight(self.name, self.type, self.shape[:2], self.data[e * n:(e + 1) * n])

    def dequantize(self) -> np.ndarray:
        """float32 (n_rows, n_in): for references and norms, never on the hot path of matrices."""
        from quantkit.quants import dequantize

        return dequantize(self.data, self.type).reshape(self.data.shape[0], self.shape[0])


class Block:
    """One transformer layer; attribute names are the GGUF names after ``blk.N.`` (``.bias`` -> ``_bias``).
    The optional ones are None when the architecture or the file has none."""

    attn_norm: np.ndarray | None   # float32 (n_embd,)   (None: pre_norms False)
    attn_q: Weight | None = None   # (n_embd -> n_head * head_dim)   (MLA: absent when q_lora_rank > 0)
    attn_k: Weight | None = None   # (n_embd -> n_head_kv * head_dim)   (absent with MLA)
    attn_v: Weight | None = None   # (n_embd -> n_head_kv * head_dim)
    # multi-head latent attention (Arch.mla; quantkit.model.layer.MLA)
    attn_q_a: Weight | None = None         # (n_embd -> q_lora_rank)
    attn_q_a_norm: np.ndarray | None = None  # float32 (q_lora_rank,)
    attn_q_b: Weight | None = None         # (q_lora_rank -> n_head * head_dim)
    attn_kv_a_mqa: Weight | None = None    # (n_embd -> kv_lora_rank + n_rot)
    attn_kv_a_norm: np.ndarray | None = None  # float32 (kv_lora_rank,)
    attn_k_b: Weight | None = None         # (head_dim - n_rot -> kv_lora_rank) x n_head, 3D: ``expert(h)`` is head h's
    attn_v_b: Weight | None = None         # (kv_lora_rank -> head_dim_v) x n_head, 3D
    attn_q_bias: np.ndarray | None = None   # float32 (n_head * head_dim,)
    attn_k_bias: np.ndarray | None = None   # float32 (n_head_kv * head_dim,)
    attn_v_bias: np.ndarray | None = None   # float32 (n_head_kv * head_dim,)
    attn_q_norm: np.ndarray | None = None   # float32 (head_dim,)   qk_norm (qk_norm_full: (n_head * head_dim,))
    attn_k_norm: np.ndarray | None = None   # float32 (head_dim,)   qk_norm (qk_norm_full: (n_head_kv * head_dim,))
    attn_output: Weight | None = None   # (n_head * head_dim -> n_embd)   (None on a DeltaNet layer)
    # gated DeltaNet (Arch.recurrent "delta_net"; quantkit.model.layer.DeltaNet), instead of attn_q ... attn_output
    attn_qkv: Weight | None = None          # (n_embd -> conv_dim): q, k, v before the convolution
    attn_gate: Weight | None = None         # (n_embd -> value_dim): z, the output norm's gate
    ssm_ba: Weight | None = None            # (n_embd -> 2 n_v_heads): beta and alpha, per key-head group
    ssm_conv1d: np.ndarray | None = None    # float32 (conv_dim, d_conv): each channel's taps, oldest first
    ssm_dt_bias: np.ndarray | None = None   # float32 (n_v_heads,): added to alpha before the softplus
    ssm_a: np.ndarray | None = None         # float32 (n_v_heads,): -exp(A_log), the decay's rate
    ssm_norm: np.ndarray | None = None      # float32 (head_dim,): the gated output norm
    ssm_out: Weight | None = None           # (value_dim -> n_embd)
    attn_output_bias: np.ndarray | None = None   # float32 (n_embd,)   attn_out_bias
    attn_sinks: np.ndarray | None = None         # float32 (n_head,)   attn_sinks
    post_attention_norm: np.ndarray | None = None  # float32 (n_embd,)   post_norms
    ffn_norm: np.ndarray | None    # float32 (n_embd,)   (None: pre_norms False)
    ffn_gate: Weight | None = None   # (n_embd -> n_ff)      dense FFN
    ffn_up: Weight | None = None     # (n_embd -> n_ff)
    ffn_down: Weight | None = None   # (n_ff -> n_embd)
    ffn_gate_inp: Weight | None = None    # (n_embd -> n_expert)                    MoE: the router
    ffn_gate_exps: Weight | None = None   # (n_embd -> n_ff_exp) x n_expert, 3D
    ffn_up_exps: Weight | None = None     # (n_embd -> n_ff_exp) x n_expert
    ffn_down_exps: Weight | None = None   # (n_ff_exp -> n_embd) x n_expert
    ffn_gate_up_exps: Weight | None = None  # (n_embd -> 2 n_ff_exp) x n_expert: gate and up merged (each
                                            # expert's gate rows, then its up rows); the two above are then None
    exp_probs_b: np.ndarray | None = None          # float32 (n_expert,): the selection's score bias  score_bias
    ffn_gate_inp_bias: np.ndarray | None = None    # float32 (n_expert,)              moe_biases
    ffn_gate_exps_bias: np.ndarray | None = None   # float32 (n_expert, n_ff_exp)
    ffn_up_exps_bias: np.ndarray | None = None     # float32 (n_expert, n_ff_exp)
    ffn_down_exps_bias: np.ndarray | None = None   # float32 (n_expert, n_embd)
    ffn_gate_inp_shexp: Weight | None = None  # (n_embd -> 1): the shared expert's gate        shared expert
    ffn_gate_shexp: Weight | None = None  # (n_embd -> n_ff_shexp)
    ffn_up_shexp: Weight | None = None    # (n_embd -> n_ff_shexp)
    ffn_down_shexp: Weight | None = None  # (n_ff_shexp -> n_embd)
    post_ffw_norm: np.ndarray | None = None        # float32 (n_embd,)   post_norms
    # a recurrent layer's (Arch.recurrent; its attention's tensors are then None)
    shortconv_in_proj: Weight | None = None     # (n_embd -> 3 n_embd): b, c, x      ShortConv
    shortconv_conv: np.ndarray | None = None    # float32 (n_embd, l_cache): each channel's taps, oldest first
    shortconv_out_proj: Weight | None = None    # (n_embd -> n_embd)


def _check_readable(where: str, name: str, qtype) -> None:
    """ModelError (one line, before any compute) for a tensor of a type quantkit has no codec for: every
    type with a codec runs, on a fast kernel or on the portable one (docs/kernels.md)."""
    from quantkit.quants import TRAITS

    if qtype not in TRAITS:
        raise ModelError(f"{where}: tensor {name!r} has type {getattr(qtype, 'name', qtype)}, which quantkit "
                         f"cannot read yet (no codec)")


def _same_dims(shape, want: tuple[int, ...]) -> bool:
    """llama.cpp's ``check_tensor_dims``: the dimensions equal once both are padded with 1s to four (so
    ERNIE 4.5's score bias, which convert_hf_to_gguf.py writes as [n_expert, 1], is an [n_expert] vector)."""
    a, b = tuple(int(d) for d in shape), tuple(want)
    n = max(len(a), len(b))
    return a + (1,) * (n - len(a)) == b + (1,) * (n - len(b))


class Llama:
    """A GGUF of one of ``SUPPORTED_ARCHS`` (llama.cpp's ``llama_model``: one class for every
    architecture), opened memory-mapped: ``config``, ``token_embd``, ``blk``, ``output``. Every
    tensor the architecture needs is checked (name and shape) here, before any compute."""

    def __init__(self, path: str | os.PathLike | GGUFModel):
        gg = path if isinstance(path, GGUFModel) else GGUFModel(path)
        self.gguf = gg
        self.path = gg.path
        self.metadata = gg.metadata
        where = str(gg.path)
        embd_rows = gg.tensor("token_embd.weight").n_rows if gg.has_tensor("token_embd.weight") else None
        c = self.config = LlamaConfig.from_metadata(gg.metadata, embd_rows, where)
        E, KV, F, V = c.n_embd, c.n_embd_kv, c.n_ff, c.n_vocab

        def matrix(name: str, n_in: int, n_out: int, n_exp: int = 0) -> Weight:
            if not gg.has_tensor(name):
                raise ModelError(f"{where}: tensor {name!r} is missing")
            t = gg.tensor(name)
            want = (n_in, n_out, n_exp) if n_exp else (n_in, n_out) if n_out else (n_in,)
            # ggml's rule (llama_model_loader::check_tensor_dims): dims past the file's count are 1, so a
            # [n_embd, 1] ffn_gate_inp_shexp (the converter's) is the [n_embd] llama.cpp asks for
            if not _same_dims(t.shape, want):
                raise ModelError(f"{where}: tensor {name!r} has shape {list(t.shape)}, expected {list(want)}")
            _check_readable(where, name, t.type)
            return Weight(name, t.type, want, t.data)

        def vector(name: str, n: int) -> np.ndarray:
            if not gg.has_tensor(name):
                raise ModelError(f"{where}: tensor {name!r} is missing")
            t = gg.tensor(name)
            if not _same_dims(t.shape, (n,)):
                raise ModelError(f"{where}: tensor {name!r} has shape {list(t.shape)}, expected [{n}]")
            _check_readable(where, name, t.type)
            if t.type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):  # the usual case: a plain read
                return np.array(t.data.view("<f4" if t.type == GGMLQuantizationType.F32 else "<f2").reshape(n),
                                dtype=np.float32)
            return np.ascontiguousarray(Weight(name, t.type, (n,), t.data).dequantize().reshape(n))

        def table(name: str, n: int, rows: int) -> np.ndarray:
            """A 2D bias tensor [n, rows] (one row of n per expert) as float32 (rows, n)."""
            w = matrix(name, n, rows)
            return np.ascontiguousarray(w.dequantize(), dtype=np.float32)

        def optional(name: str, n: int) -> np.ndarray | None:
            return vector(name, n) if gg.has_tensor(name) else None

        a = c.arch
        Q, hd = c.n_embd_q, c.head_dim
        self.token_embd = matrix("token_embd.weight", E, V)          # (n_vocab rows of n_embd)
        self.blk: list[Block] = []
        for i in range(c.n_layer):
            b = Block()
            p = f"blk.{i}."
            recr = c.is_recurrent(i)
            for extra in UNSUPPORTED_LAYER_TENSORS:
                if gg.has_tensor(p + extra) and not (a.attn_out_bias and extra == "attn_output.bias") and \
                        not (recr and extra == "attn_qkv.weight"):
                    raise ModelError(f"{where}: tensor {p + extra!r} is not supported by quantkit's {a.name}")
            b.attn_norm = vector(p + "attn_norm.weight", E) if a.pre_norms else None
            if recr and a.recurrent == "shortconv":   # llama_model_lfm2::load_arch_tensors: the short convolution
                b.shortconv_in_proj = matrix(p + "shortconv.in_proj.weight", E, 3 * E)
                b.shortconv_conv = np.ascontiguousarray(matrix(p + "shortconv.conv.weight", c.l_cache, E).dequantize())
                b.shortconv_out_proj = matrix(p + "shortconv.out_proj.weight", E, E)
            elif recr:      # llama_model_qwen3next::load_arch_tensors: a gated DeltaNet layer
                if gg.has_tensor(p + "ssm_in.weight"):
                    raise ModelError(f"{where}: tensor {p + 'ssm_in.weight'!r}: the legacy Qwen3-Next layout (q, k, v "
                                     f"and z in one projection) is not supported; convert the model again with "
                                     f"llama.cpp's convert_hf_to_gguf.py, which writes attn_qkv and attn_gate")
                HK, HV, SD, K = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state, c.ssm_d_conv
                conv = 2 * HK * SD + HV * SD
                b.attn_qkv = matrix(p + "attn_qkv.weight", E, conv)
                b.attn_gate = matrix(p + "attn_gate.weight", E, HV * SD)
                b.ssm_ba = matrix(p + "ssm_ba.weight", E, 2 * HV)
                b.ssm_conv1d = table(p + "ssm_conv1d.weight", K, conv)
                b.ssm_dt_bias = vector(p + "ssm_dt.bias", HV)
                b.ssm_a = vector(p + "ssm_a", HV)
                b.ssm_norm = vector(p + "ssm_norm.weight", SD)
                b.ssm_out = matrix(p + "ssm_out.weight", HV * SD, E)
            elif a.mla:       # llama_model_deepseek2::load_arch_tensors (is_mla)
                R, LQ, LKV = c.n_rot, c.n_lora_q, c.n_lora_kv
                if LQ:
                    b.attn_q_a = matrix(p + "attn_q_a.weight", E, LQ)
                    b.attn_q_a_norm = vector(p + "attn_q_a_norm.weight", LQ)
                    b.attn_q_b = matrix(p + "attn_q_b.weight", LQ, Q)
                else:
                    b.attn_q = matrix(p + "attn_q.weight", E, Q)
                b.attn_kv_a_mqa = matrix(p + "attn_kv_a_mqa.weight", E, LKV + R)
                b.attn_kv_a_norm = vector(p + "attn_kv_a_norm.weight", LKV)
                b.attn_k_b = matrix(p + "attn_k_b.weight", hd - R, LKV, c.n_head)     # one matrix per head
                b.attn_v_b = matrix(p + "attn_v_b.weight", LKV, c.head_dim_v, c.n_head)
                b.attn_output = matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, E)
            else:
                # attn_gate: each head's query rows, then its output gate's (build_layer_attn of qwen3next)
                b.attn_q = matrix(p + "attn_q.weight", E, 2 * Q if a.attn_gate else Q)
                b.attn_k = matrix(p + "attn_k.weight", E, KV)
                b.attn_v = matrix(p + "attn_v.weight", E, KV)
                b.attn_q_bias = optional(p + "attn_q.bias", Q)            # create_tensor_qkv: optional
                b.attn_k_bias = optional(p + "attn_k.bias", KV)
                b.attn_v_bias = optional(p + "attn_v.bias", KV)
                if a.qk_norm or (a.qk_norm_optional and gg.has_tensor(p + "attn_q_norm.weight")):
                    # per head, or (qk_norm_full) over the whole projection
                    b.attn_q_norm = vector(p + "attn_q_norm.weight", Q if a.qk_norm_full else hd)
                    b.attn_k_norm = vector(p + "attn_k_norm.weight", KV if a.qk_norm_full else hd)
                b.attn_output = matrix(p + "attn_output.weight", Q, E)
            if a.attn_out_bias and not c.is_recurrent(i):
                b.attn_output_bias = vector(p + "attn_output.bias", E)
            if a.attn_sinks and not c.is_recurrent(i):
                b.attn_sinks = vector(p + "attn_sinks.weight", c.n_head)
            if a.post_norms:
                b.post_attention_norm = vector(p + "post_attention_norm.weight", E)
            b.ffn_norm = vector(p + a.ffn_norm + ".weight", E) if a.pre_norms else None
            if c.is_moe(i):
                read = (SHEXP_TENSORS[0 if a.shexp_gate else 1:] if a.shared_expert else ()) + \
                    (MOE_BIAS_TENSORS if a.moe_biases else ()) + \
                    (("exp_probs_b.bias",) if a.score_bias else ())
                for extra in UNSUPPORTED_MOE_TENSORS:
                    if extra not in read and gg.has_tensor(p + extra):
                        raise ModelError(f"{where}: tensor {p + extra!r} is not supported by quantkit's {a.name} "
                                         f"(its layer has no shared expert or expert biases; quantkit runs "
                                         f"qwen2moe's shared expert and gpt-oss's biases)")
                X, FX = c.n_expert, c.n_ff_exp
                b.ffn_gate_inp = matrix(p + "ffn_gate_inp.weight", E, X)
                if gg.has_tensor(p + "ffn_gate_up_exps.weight"):
                    # create_tensor_gate_up_exps: the experts' gate and up in one tensor (the converter's
                    # --fuse-gate-up-exps), each expert's gate rows then its up rows
                    if a.moe_biases:
                        raise ModelError(f"{where}: tensor {p + 'ffn_gate_up_exps.weight'!r} (gate and up merged) "
                                         f"with the experts' biases is not supported by quantkit's {a.name}")
                    b.ffn_gate_up_exps = matrix(p + "ffn_gate_up_exps.weight", E, 2 * FX, X)
                else:
                    b.ffn_gate_exps = matrix(p + "ffn_gate_exps.weight", E, FX, X)
                    b.ffn_up_exps = matrix(p + "ffn_up_exps.weight", E, FX, X)
                b.ffn_down_exps = matrix(p + "ffn_down_exps.weight", FX, E, X)
                if a.score_bias:
                    b.exp_probs_b = optional(p + "exp_probs_b.bias", X)
                if a.moe_biases:
                    b.ffn_gate_inp_bias = vector(p + "ffn_gate_inp.bias", X)
                    b.ffn_gate_exps_bias = table(p + "ffn_gate_exps.bias", FX, X)
                    b.ffn_up_exps_bias = table(p + "ffn_up_exps.bias", FX, X)
                    b.ffn_down_exps_bias = table(p + "ffn_down_exps.bias", E, X)
                if a.shared_expert and c.n_ff_shexp:
                    FS = c.n_ff_shexp
                    if a.shexp_gate:
                        b.ffn_gate_inp_shexp = matrix(p + "ffn_gate_inp_shexp.weight", E, 0)   # one row: [n_embd]
                    b.ffn_gate_shexp = matrix(p + "ffn_gate_shexp.weight", E, FS)
                    b.ffn_up_shexp = matrix(p + "ffn_up_shexp.weight", E, FS)
                    b.ffn_down_shexp = matrix(p + "ffn_down_shexp.weight", FS, E)
            else:
                b.ffn_gate = matrix(p + "ffn_gate.weight", E, F)
                b.ffn_up = matrix(p + "ffn_up.weight", E, F)
                b.ffn_down = matrix(p + "ffn_down.weight", F, E)
            if a.post_norms:
                b.post_ffw_norm = vector(p + "post_ffw_norm.weight", E)
            self.blk.append(b)
        #: one ``quantkit.model.layer.Layer`` per block: what every forward path interprets
        self.layers: tuple[Layer, ...] = tuple(describe(c, b, i) for i, b in enumerate(self.blk))
        self.output_norm = vector(a.output_norm + ".weight", E)            # (n_embd,)
        self.output = matrix("output.weight", E, V) if gg.has_tensor("output.weight") else self.token_embd
        self.output_bias = optional("output.bias", V) if a.output_bias else None
        # rope_freqs: per-pair frequency divisors (llama 3.x long-context); ones when absent
        self.rope_freqs = vector("rope_freqs.weight", c.n_rot // 2) if gg.has_tensor("rope_freqs.weight") else None

    @property
    def moe(self) -> bool:
        """Whether any layer's FFN is a mixture of experts."""
        return any(isinstance(d.ffn, MoeFFN) for d in self.layers)

    def matrices(self) -> list[Weight]:
        """Every matrix (and 3D expert tensor) the products read, in file order per layer."""
        out = [self.token_embd]
        for b in self.blk:
            out += [w for w in (b.shortconv_in_proj, b.shortconv_out_proj, b.attn_qkv, b.attn_gate, b.ssm_ba, b.ssm_out,
                                b.attn_q, b.attn_q_a, b.attn_q_b, b.attn_kv_a_mqa, b.attn_k_b, b.attn_v_b, b.attn_k,
                                b.attn_v, b.attn_output, b.ffn_gate_inp, b.ffn_gate, b.ffn_up,
                                b.ffn_down, b.ffn_gate_exps, b.ffn_up_exps, b.ffn_gate_up_exps, b.ffn_down_exps,
                                b.ffn_gate_inp_shexp,
                                b.ffn_gate_shexp, b.ffn_up_shexp, b.ffn_down_shexp) if w is not None]
        if self.output is not self.token_embd:
            out.append(self.output)
        return out

    def close(self) -> None:
        self.gguf.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | os.PathLike) -> Llama:
    return Llama(path)
