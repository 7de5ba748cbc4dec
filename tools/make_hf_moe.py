"""Tiny Granite MoE / ERNIE 4.5 MoE / DeepSeek V3 / GLM-4.5 checkpoints made by transformers' own model
classes, with weights drawn for peaked logits: the issue's agreement check (tools/arch_agreement.sh on what
convert_hf_to_gguf.py makes of them, and ``quantkit convert`` against that file). (It began as a copy of
tools/make_hf_dense.py, kept apart so that each family's documented figures come from the same draws.)

The steps are tools/make_hf_dense.py's (its docstring), with this script making the model:
``$CONVERT_PY tools/make_hf_moe.py DIR [N_LAYER]``.

(NAME: granitemoe, ernie4_5moe, deepseek2, deepseek2lite or glm4moe; $CONVERT_PY a venv with torch and
transformers, docs/DEVELOPING.md.) This script reads DIR/config.json, sets ``num_hidden_layers`` to
N_LAYER (default 4: SmolLM3's fourth layer is its first without RoPE), builds the model with
``AutoModelForCausalLM.from_config`` (so the tensor names and config keys are the library's), re-draws
every weight with a fixed seed and writes it with ``save_pretrained`` in float16. It then checks that the
saved tensors' names and shapes are what ``quantkit.checkpoints.hf_tensors`` lists for the same config:
the numpy-made checkpoints of tests/test_convert.py name their tensors as transformers saves them.

The weights: matrices normal with std 2 / sqrt(fan_in) for Q, K, the FFN gate and the MoE router (DeepSeek's
latent attention: q_a 1, q_b 2, kv_a 1.5, kv_b 2),
1 / sqrt(fan_in) for V and up (an expert's merged gate and up: 1.5), 3 / sqrt(fan_in) for the attention
output and the FFN down (each layer moves the residual); fan_in is the last axis (a 3D expert tensor
is one matrix per expert). The embeddings (and an untied lm_head) std 0.5 (Gemma 2: 0.25, its embeddings
are scaled by sqrt(hidden); the lm_head times ``logits_scaling`` where the logits are divided by it);
norms around 1 (Gemma's stored as weight - 1; its post-norms around 3, so its tied output is not
dominated by the input token's own embedding); the router's score bias std 0.1. Past 4 layers the gain
of every matrix without "gate" in its name (the FFN gates and the router keep theirs) is multiplied by
sqrt(4 / N_LAYER): 26 layers at the full gains were chaotic (llama.cpp against itself at two micro-batch
sizes: mean KLD 0.28, same top 63 %). GLM-4.5 (``glm4_moe``): config.json's sizes are set over
checkpoints.py's by ``SHAPE`` (hidden 256, 8 heads of 64 with 2 KV heads, 8 experts of width 64, 2 used,
a shared expert, the dense first layer 512 wide: GLM-4.5-Air's ratios), its Q/K/V biases normal with std
``BIAS_STD`` 0.5, its Q/K norms as the other norms; no multi-token-prediction layer
(``num_nextn_predict_layers`` 0: both converters write the key as 0 and no extra block). Its routed
experts' down projections at gain 0.4 (``TYPE_GAIN``: times ``routed_scaling_factor`` 2.5, 1) and its
lm_head std 0.25 (``LM_HEAD_STD``: hidden 256, logits as spread as the hidden-64 files'): at the common
gains a routing choice flipped by llama.cpp's own micro-batch rounding moved the residual so far that
llama.cpp against itself (-ub 16 against -ub 512, 10 x 512 tokens) was mean KLD 0.135, same top 97.6 %
(median 0.0006); all 8 experts used instead: 0.0007. With these: 0.0011, same top 98.8 %. Granite MoE's
embeddings are untied here (``UNTIE``): with its logits divided by ``logits_scaling`` a tied output
would be the input embedding's scale, not a peaked one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from quantkit.checkpoints import hf_tensors  # noqa: E402  (numpy only)

SEED = 5
#: matrix std times sqrt(fan_in), by a part of the parameter's name (the first that matches)
GAIN = {"q_a_proj": 1.0, "q_b_proj": 2.0, "kv_a_proj_with_mqa": 1.5, "kv_b_proj": 2.0, "q_proj": 2.0, "k_proj": 2.0, "gate_up_proj": 1.5, "gate_proj": 2.0, "v_proj": 1.0, "up_proj": 1.0,
        "o_proj": 3.0, "down_proj": 3.0, "router": 2.0, "mlp.gate.weight": 2.0}
#: model types whose checkpoints here have an untied lm_head
UNTIE = ("granitemoe",)
#: config.json keys set over quantkit/checkpoints.py's, by model type: GLM-4.5's structure (GLM-4.5-Air's
#: ratios: Q twice the hidden width, 2 KV heads, a quarter-width expert) shrunk to hidden 256
SHAPE = {"glm4_moe": {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                      "intermediate_size": 512, "moe_intermediate_size": 64, "n_routed_experts": 8,
                      "num_experts_per_tok": 2, "n_shared_experts": 1}}
#: std of the attention projections' biases (GLM's Q/K/V; no other family here has them)
BIAS_STD = 0.5
#: gains looked up before GAIN's, by model type; the lm_head's std, by model type
TYPE_GAIN = {"glm4_moe": {"mlp.experts.down_proj": 0.4}}
LM_HEAD_STD = {"glm4_moe": 0.25}


def main() -> None:
    folder = Path(sys.argv[1])
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    cfg_json = json.loads((folder / "config.json").read_text())
    cfg_json["num_hidden_layers"] = n_layer
    cfg_json.pop("no_rope_layers", None)      # SmolLM3Config derives it from no_rope_layer_interval
    cfg_json["torch_dtype"] = "float16"
    cfg_json.update(SHAPE.get(cfg_json["model_type"], {}))
    if cfg_json["model_type"] in UNTIE:
        cfg_json["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(cfg_json, indent=2))
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    gemma = config.model_type == "gemma2"
    logit_div = getattr(config, "logits_scaling", 1.0) or 1.0
    depth = min(1.0, (4 / n_layer) ** 0.5)      # deeper than 4 layers: every matrix but the gates gentler
    gains = {**TYPE_GAIN.get(config.model_type, {}), **GAIN}
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        for name, p in tensors:
            if "rotary_emb" in name:
                continue
            if "e_score_correction_bias" in name:     # the router's score bias (a buffer or a [1, n] parameter)
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif name.endswith("_proj.bias"):          # GLM's Q/K/V biases
                p.copy_(torch.randn(p.shape, generator=g) * BIAS_STD)
            elif p.ndim == 1:       # norms: Gemma stores weight - 1
                lo, hi = (2.0, 4.0) if gemma and "post_" in name else (0.8, 1.2)
                p.copy_(torch.empty(p.shape).uniform_(lo, hi, generator=g) - (1.0 if gemma else 0.0))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.25 if gemma else 0.5))
            elif "lm_head" in name:
                std = LM_HEAD_STD.get(config.model_type) or (0.25 if gemma else 0.5 * logit_div)
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                gain = next(v for k, v in gains.items() if k in name) * (1.0 if "gate" in name else depth)
                p.copy_(torch.randn(p.shape, generator=g) * (gain / p.shape[-1] ** 0.5))
    for f in folder.glob("model*.safetensors*"):
        f.unlink()
    model.to(torch.float16).save_pretrained(folder, safe_serialization=True)
    check_names(folder)
    print(f"{folder}: {type(model).__name__}, {n_layer} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)


def check_names(folder: Path) -> None:
    """The saved tensors (names, shapes) against quantkit.checkpoints.hf_tensors of the saved config."""
    from safetensors import safe_open

    saved = {}
    for f in sorted(folder.glob("model*.safetensors")):
        with safe_open(str(f), "pt") as st:
            saved.update({n: tuple(st.get_slice(n).get_shape()) for n in st.keys()})
    cfg = json.loads((folder / "config.json").read_text())
    listed = dict(hf_tensors(cfg))
    if saved != listed:
        diff = sorted(set(saved.items()) ^ set(listed.items()))
        raise SystemExit(f"{folder}: transformers saved other tensors than quantkit.checkpoints.hf_tensors "
                         f"lists: {diff[:6]}")


if __name__ == "__main__":
    main()
