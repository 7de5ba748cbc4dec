"""One description of a transformer layer, read once from the GGUF, that every forward path interprets.

llama.cpp builds one graph per architecture over shared builders (``build_norm``, ``build_attn``,
``build_ffn``, ``build_moe_ffn`` in src/llama-graph.cpp) and runs it for a batch and for one token alike.
quantkit's three paths -- the batch ``forward.Runner``, the compiled ``decode.step_body`` and the float64
``reference`` -- read the same ``Layer`` records instead of the architecture's name or its table row:
``Llama`` builds them (``describe``) from the ``Arch`` row, the config and which optional tensors the file
has, and each path is a straight interpreter of them over its own ops. A new kind of FFN or attention is a
new record kind here, one op per path kind, and a test of each path against the reference.

What the paths do with each kind today:

=====================  ==========================  =========================  ==========================
record                 reference (float64)         batch path                 compiled decode step
=====================  ==========================  =========================  ==========================
``Attn``               every flag                  every flag                 every flag (``dims``), sinks
                                                                              and output bias per layer
``DenseFFN``           GLU, post-norm              GLU, post-norm             GLU, post-norm
``MoeFFN``             router, top-k, experts,     experts over their tokens, router, ``moe_route``, the
                       biases, shared expert       biases, shared expert      chosen experts' rows only, the
                                                                              shared expert after them
=====================  ==========================  =========================  ==========================

The compiled step takes one attention kind and one FFN kind for all layers (``DecodeStep`` refuses other
mixes in one line, and the Runner then runs single tokens on the batch path).
"""

from __future__ import annotations

from dataclasses import dataclass

#: expert gating functions (llama_expert_gating_func_type) quantkit runs: "softmax" (the chosen experts'
#: softmax probabilities over all experts), "softmax_weight" (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT,
#: gpt-oss: the top-k of the raw logits, weighted by the softmax of those k logits alone)
GATINGS = ("softmax", "softmax_weight")


@dataclass(frozen=True)
class Attn:
    """The attention block: ``rmsnorm(x) * attn_norm`` -> Q/K/V -> (biases) -> (per-head Q/K RMSNorm)
    -> RoPE -> causal (sliding-window) softmax attention (with a sink logit per head) -> attn_output
    (+ bias) -> (post norm) -> residual add."""

    rope_neox: bool     # llama_model_rope_type: NEOX pairs (x[i], x[i + n_rot/2]), NORM (x[2i], x[2i+1])
    qkv_bias: bool      # blk.N.attn_{q,k,v}.bias (any of them; a missing one counts as zeros)
    qk_norm: bool       # blk.N.attn_q_norm / attn_k_norm
    post_norm: bool     # blk.N.post_attention_norm
    n_swa: int          # sliding window (0: the whole context)
    rope_table: int     # 0: the model's RoPE base and scaling; 1: the sliding layers' base
    sinks: bool = False     # blk.N.attn_sinks: per head, one more logit in the softmax's denominator
    out_bias: bool = False  # blk.N.attn_output.bias, added after the output product


@dataclass(frozen=True)
class DenseFFN:
    """``rmsnorm(x) * ffn_norm`` -> (act(h @ ffn_gate) * (h @ ffn_up)) @ ffn_down -> (post norm) -> add
    (llama.cpp's build_ffn with LLM_FFN_PAR)."""

    glu: str            # "silu" (LLM_FFN_SILU) or "gelu" (LLM_FFN_GELU, ggml's tanh GELU)
    post_norm: bool     # blk.N.post_ffw_norm
    n_ff: int


@dataclass(frozen=True)
class MoeFFN:
    """llama.cpp's build_moe_ffn: ``h = rmsnorm(x) * ffn_norm``; router logits ``h @ ffn_gate_inp``
    (n_expert); probabilities by ``gating``; the ``n_expert_used`` largest (ggml_argsort_top_k: ties to the
    lower expert index); their probabilities as weights, divided by their sum when ``norm_w`` (the sum
    clamped below at 6.103515625e-5), times ``w_scale`` unless it is 0 or 1; each chosen expert e gives
    ``(act(h @ gate_exps[e]) * (h @ up_exps[e])) @ down_exps[e]`` times its weight, and the outputs are
    added in the order of selection (the largest first). With a shared expert (``n_ff_shexp`` > 0,
    qwen2moe), ``sigmoid(h . ffn_gate_inp_shexp) * (act(h @ gate_shexp) * (h @ up_shexp)) @ down_shexp``
    is added after them (src/models/qwen2moe.cpp)."""

    n_expert: int
    n_expert_used: int
    n_ff: int           # one expert's width
    gating: str         # GATINGS
    norm_w: bool
    w_scale: float
    glu: str
    n_ff_shexp: int = 0  # the shared expert's width (0: none)
    biases: bool = False  # the router's bias (added to its logits) and the experts' (ggml_add_id after
                          # each expert's gate, up and down products; gpt-oss)


@dataclass(frozen=True)
class Layer:
    attn: Attn
    ffn: DenseFFN | MoeFFN

    @property
    def moe(self) -> bool:
        return isinstance(self.ffn, MoeFFN)


def describe(config, block, il: int) -> Layer:
    """The ``Layer`` of layer ``il``: the config's (``LlamaConfig``) architecture row and hyperparameters,
    and which optional tensors ``block`` (a loaded ``llama.Block``) has."""
    c, a = config, config.arch
    swa = c.is_swa(il)
    attn = Attn(rope_neox=a.rope_neox,
                qkv_bias=any(getattr(block, n) is not None for n in ("attn_q_bias", "attn_k_bias", "attn_v_bias")),
                qk_norm=block.attn_q_norm is not None, post_norm=block.post_attention_norm is not None,
                n_swa=c.n_swa if swa else 0, rope_table=1 if swa else 0, sinks=block.attn_sinks is not None,
                out_bias=block.attn_output_bias is not None)
    if c.n_expert:
        # qwen3moe, qwen2moe, gpt-oss and llama (Mixtral) call build_moe_ffn with softmax gating (gpt-oss:
        # softmax_weight), norm_w = true (qwen2moe, gpt-oss: false) and hparams.expert_weights_scale,
        # which none of them loads (so 0: no scaling)
        ffn = MoeFFN(n_expert=c.n_expert, n_expert_used=c.n_expert_used, n_ff=c.n_ff_exp, gating=a.moe_gating,
                     norm_w=a.moe_norm_w, w_scale=0.0, glu=a.glu,
                     n_ff_shexp=c.n_ff_shexp if a.shared_expert else 0, biases=a.moe_biases)
    else:
        ffn = DenseFFN(glu=a.glu, post_norm=block.post_ffw_norm is not None, n_ff=c.n_ff)
    return Layer(attn, ffn)
