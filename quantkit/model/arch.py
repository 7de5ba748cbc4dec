"""What differs between the architectures quantkit runs: one table row per architecture.

The layer math is written once (``quantkit.model.forward``'s batch path, ``quantkit.model.decode``'s
compiled step, ``quantkit.model.reference``'s float64 forward); each of them reads an ``Arch`` row and
the ``LlamaConfig`` built from it, never the architecture's name. Adding an architecture means a row
here and, at most, one new op. The facts come from llama.cpp: ``llama_model_rope_type`` (NORM vs NEOX),
each architecture's ``load_arch_hparams`` / ``load_arch_tensors`` (src/models/<arch>.cpp: which keys
and tensors it reads, which are optional) and its graph (the order of norms, the activation, the
embedding and attention scales).

A layer, in the order every path runs it (the optional steps are this table's flags)::

    x = token_embd[tok]                      (* sqrtf(n_embd)             if embd_scale)
    per layer:
      h = rmsnorm(x) * attn_norm
      q, k, v = h @ attn_q/k/v               (+ attn_q/k/v.bias           when the file has them)
      q, k = per-head rmsnorm * attn_q_norm / attn_k_norm                 if qk_norm
      q, k = rope(q, k)                      (NORM or NEOX pairs; SWA layers use the SWA base)
      o = softmax(scale * q k^T + causal [+ sliding-window] mask) v @ attn_output
      o = rmsnorm(o) * post_attention_norm                                 if post_norms
      x = x + o
      h = rmsnorm(x) * ffn_norm
      f = (act(h @ ffn_gate) * (h @ ffn_up)) @ ffn_down   act = SiLU or GELU (tanh form)
      f = rmsnorm(f) * post_ffw_norm                                       if post_norms
      x = x + f
    logits = rmsnorm(x) * output_norm @ output   (+ output.bias; cap * tanh(logits / cap) if softcap)
"""

from __future__ import annotations

from dataclasses import dataclass


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


#: GLU activations: the index the compiled kernels switch on
GLU_KINDS = ("silu", "gelu")

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", rope_neox=False, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False),
    Arch("qwen2", rope_neox=True, qk_norm=False, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=True, softcap=False),
    Arch("qwen3", rope_neox=True, qk_norm=True, post_norms=False, glu="silu", embd_scale=False, swa_pattern=0,
         output_bias=False, softcap=False),
    Arch("gemma3", rope_neox=True, qk_norm=True, post_norms=True, glu="gelu", embd_scale=True, swa_pattern=6,
         output_bias=False, softcap=True),
)}

SUPPORTED_ARCHS = tuple(ARCHS)

#: tensors llama.cpp may read for these architectures that quantkit does not apply: a file that has one
#: is refused rather than run without it (suffixes after ``blk.N.``)
UNSUPPORTED_LAYER_TENSORS = ("attn_qkv.weight", "attn_output.bias", "ffn_gate.bias", "ffn_up.bias",
                             "ffn_down.bias")
