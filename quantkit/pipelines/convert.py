"""``quantkit convert``: a Hugging Face safetensors checkpoint to GGUF, as llama.cpp's
``convert_hf_to_gguf.py`` writes it (the same tensor names, shapes, types and bytes, the same KV pairs).

Plan first, then stream (docs/convert.md):

1. ``plan_conversion`` reads config.json and every shard's header (``formats.safetensors.Checkpoint``),
   picks the architecture's row of ``ARCHS``, maps every tensor to its GGUF name (gguf-py's
   ``TensorNameMap``, as the reference does), decides each output type (``output_type``), checks the
   config against the tensors' shapes, and builds every KV pair in the reference's order on an in-memory
   ``gguf.GGUFWriter`` (``TextModel.prepare_metadata``: type, gguf-py's ``Metadata`` from the folder,
   the hyperparameters, the quantization version, then the tokenizer). Every refusal happens here.
2. ``convert`` writes the header and then each tensor in the reference's order through
   ``formats.gguf_io.GGUFOutput`` (a temporary file renamed at the end), reading one tensor -- or a range
   of rows, or one expert -- at a time, so memory stays near the largest chunk, not the model.

The per-architecture part is only what differs (``Arch``): llama and Mixtral (Q/K rows permuted back
from Hugging Face's RoPE layout, experts stacked into 3D tensors, Llama 3's RoPE factors), qwen2, qwen3,
qwen3moe, gemma3 (norms + 1, embeddings cut to the real vocabulary), lfm2 and lfm2moe (KV heads per layer,
the convolution taps squeezed), qwen3next (the DeltaNet's q/k/v/z projection split, its decay's -exp(A_log);
converted as the reference's ``--no-mtp``), minimax-m2, llama4 (the text model of the multimodal
checkpoints, its 3D experts split and transposed), granitemoe (a merged tensor split: ``Split``),
ernie4_5-moe, deepseek2 (kv_b split per head: ``Source.heads``). Hyperparameters
absent from config.json take the defaults of transformers' config class, which the reference reads
the config through (``CONFIG_DEFAULTS``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as FT

from quantkit.errors import FormatError
from quantkit.formats.gguf_io import KV, GGUFOutput, Tensor, tensor_nbytes
from quantkit.formats.safetensors import FLOAT_DTYPES, Checkpoint

#: --outtype -> file type; "auto" is resolved from the first matrix's dtype (``resolve_auto``)
OUTTYPES = {"f32": FT.ALL_F32, "f16": FT.MOSTLY_F16, "bf16": FT.MOSTLY_BF16, "q8_0": FT.MOSTLY_Q8_0}
_FT_TYPE = {FT.ALL_F32: T.F32, FT.MOSTLY_F16: T.F16, FT.MOSTLY_BF16: T.BF16, FT.MOSTLY_Q8_0: T.Q8_0}
#: rows read at once from a large plain tensor (64 MiB of float32 at the most)
CHUNK_BYTES = 64 << 20

#: transformers' config-class defaults (transformers 5.x) for the keys the reference reads, by
#: ``model_type``; ``head_dim`` None means "not set" (no key_length written), "derived" hidden / heads
CONFIG_DEFAULTS = {
    "llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim="derived"),
    "mixtral": dict(max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, rope_theta=1e6, head_dim=None),
    "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=None),
    "qwen3": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=128),
    "gemma3_text": dict(max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1e6, head_dim=256,
                        rope_local_base_freq=10000.0, sliding_window=4096, num_attention_heads=8,
                        num_key_value_heads=4),
    "qwen3_moe": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=None,
                      num_experts_per_tok=8, moe_intermediate_size=768),
    "glm4_moe": dict(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=10000.0, head_dim=None,
                     num_experts_per_tok=8, moe_intermediate_size=1408, n_shared_experts=1, n_routed_experts=128,
                     routed_scaling_factor=1.0, first_k_dense_replace=1, norm_topk_prob=True,
                     num_nextn_predict_layers=1, partial_rotary_factor=0.5, n_group=1, topk_group=1),
    "smollm3": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=2000000.0, head_dim=None),
    "olmo2": dict(max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, head_dim=None),
    "qwen3_next": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=256,
                       num_experts_per_tok=10, num_experts=512, moe_intermediate_size=512,
                       shared_expert_intermediate_size=512, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                       num_key_value_heads=2, num_attention_heads=16),
    "ernie4_5_moe": dict(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, head_dim=None,
                         moe_intermediate_size=1536, moe_k=6, moe_num_experts=64, moe_num_shared_experts=2,
                         moe_layer_start_index=1, moe_layer_interval=1),
    "deepseek_v3": dict(max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, moe_intermediate_size=2048,
                        n_routed_experts=256, n_shared_experts=1, routed_scaling_factor=2.5, n_group=8, topk_group=4,
                        num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True),
    "granitemoe": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=None),
    "gemma2": dict(max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=256,
                   sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   num_attention_heads=8, num_key_value_heads=4),
    "lfm2": dict(max_position_embeddings=128000, norm_eps=1e-5, rope_theta=1e6, head_dim=None, conv_L_cache=3,
                 block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True),
    "lfm2_moe": dict(max_position_embeddings=128000, norm_eps=1e-5, rope_theta=1e6, head_dim=None, conv_L_cache=3,
                     num_dense_layers=2, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=1792),
    "minimax_m2": dict(max_position_embeddings=196608, rms_norm_eps=1e-6, rope_theta=5e6, head_dim=128,
                       num_key_value_heads=8, num_local_experts=256, num_experts_per_tok=8, intermediate_size=1536),
    "llama4_text": dict(max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, head_dim=128,
                        num_key_value_heads=8, num_local_experts=16, num_experts_per_tok=1, intermediate_size=8192,
                        intermediate_size_mlp=16384, interleave_moe_layer_step=1, no_rope_layer_interval=4),
}

#: config.json keys transformers' config class takes under another name (Lfm2Config.__post_init__ pops
#: them into the attribute the reference reads), by ``model_type``
CONFIG_RENAMES = {"lfm2": {"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings"},
                  "lfm2_moe": {"tie_embedding": "tie_word_embeddings"}}


@dataclass(frozen=True)
class Experts:
    """Per-expert tensors stacked into one 3D tensor per projection, once a layer's are all read
    (``LlamaModel.modify_tensors`` for Mixtral, ``Qwen2MoeModel.modify_tensors``)."""

    key: str                  # the part of an HF name that marks an expert's tensor
    projections: tuple[str, ...]  # in the order the stacked tensors are written
    merged: str               # the stacked tensor's HF-style name (mapped to GGUF by TensorNameMap)


@dataclass(frozen=True)
class Split:
    """One HF tensor written as several GGUF tensors, equal slices of its rows (the next-to-last axis:
    each expert's rows in a 3D tensor), in order (``GraniteMoeModel.modify_tensors``)."""

    suffix: str                             # the HF name's end
    parts: tuple[gguf.MODEL_TENSOR, ...]    # what each slice is written as


@dataclass(frozen=True)
class Arch:
    """What one Hugging Face architecture family changes (conversion/llama.py, conversion/qwen.py)."""

    gguf_arch: gguf.MODEL_ARCH
    permute_qk: bool = False          # LlamaModel.undo_permute
    experts: Experts | None = None
    llama_keys: bool = False          # LlamaModel.set_gguf_parameters: vocab_size, rope dimension count
    moe_keys: bool = False            # Qwen2MoeModel.set_gguf_parameters: the experts' FFN widths
    tokenizer_prefix_space: bool = False  # LlamaModel.set_vocab: add_space_prefix from tokenizer_config
    gemma3: bool = False              # Gemma3Model: norms + 1, embeddings cut to the real vocabulary, its keys
    sentencepiece_first: bool = True  # set_vocab reads a tokenizer.model when there is one (not TextModel's)
    glm_moe: bool = False             # Glm4MoeModel: the MoE keys, partial RoPE, nextn blocks in block_count
    #: (type, added token) the vocabulary's special tokens are set to where the tokenizer did not set them
    #: (TextModel._set_vocab_glm)
    special_tokens: tuple[tuple[str, str], ...] = ()
    gemma2: bool = False              # Gemma2Model: norms + 1, its own parameter keys (no TextModel ones), a
                                      # SentencePiece tokenizer.model without a space prefix
    lfm2: str = ""                    # "dense" (LFM2Model) / "moe" (LFM2MoeModel): KV heads per layer (0: a short
                                      # convolution), its keys after TextModel's, the convolution taps squeezed
                                      # to 2D; "moe": experts stacked, feed_forward.expert_bias the score bias
    qwen3next: bool = False           # Qwen3NextModel (Qwen2MoeModel's keys and experts): the DeltaNet's keys and
                                      # tensors (``_qwen3next_sources``), norms + 1 but the DeltaNet's, no MTP
    minimax_m2: bool = False          # MiniMaxM2Model: the experts' width and rope.dimension_count (rotary_dim)
    llama4: bool = False              # Llama4Model: the FFN widths swapped, its keys, gate_up_proj / down_proj
                                      # split and transposed, GPT-2 style vocabulary only
    #: GraniteModel: head_dim ignored, the multipliers written as scales, GraniteMoeModel's shared width
    granite: bool = False
    splits: tuple[Split, ...] = ()
    #: Ernie4_5MoeModel: its MoE keys, a SentencePiece tokenizer.model only (add_prefix_space after it)
    ernie_moe: bool = False
    skipped: tuple[str, ...] = ()     # name prefixes the reference's filter_tensors drops
    #: DeepseekV2Model: multi-head latent attention (kv_b_proj split into attn_k_b / attn_v_b, its keys, one
    #: KV head), the layers past num_hidden_layers (multi-token prediction) and a tied lm_head dropped
    deepseek2: bool = False


_LLAMA = Arch(gguf.MODEL_ARCH.LLAMA, permute_qk=True, llama_keys=True, tokenizer_prefix_space=True,
              experts=Experts("block_sparse_moe.experts", ("w1", "w2", "w3"),
                              "layers.{bid}.feed_forward.experts.{wid}.weight"))
_LLAMA4 = Arch(gguf.MODEL_ARCH.LLAMA4, llama_keys=True, sentencepiece_first=False, llama4=True)
ARCHS = {
    "LlamaForCausalLM": _LLAMA,
    "MixtralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": Arch(gguf.MODEL_ARCH.QWEN2),
    "Qwen3ForCausalLM": Arch(gguf.MODEL_ARCH.QWEN3),
    "Gemma3ForCausalLM": Arch(gguf.MODEL_ARCH.GEMMA3, gemma3=True),
    "Qwen3MoeForCausalLM": Arch(gguf.MODEL_ARCH.QWEN3MOE, moe_keys=True, sentencepiece_first=False,
                                experts=Experts("mlp.experts", ("down_proj", "gate_proj", "up_proj"),
                                                "model.layers.{bid}.mlp.experts.{wid}.weight")),
    # conversion/glm.py's Glm4MoeModel (GLM-4.5 / 4.6 / 4.7)
    "Glm4MoeForCausalLM": Arch(gguf.MODEL_ARCH.GLM4_MOE, sentencepiece_first=False, glm_moe=True,
                               experts=Experts("mlp.experts", ("down_proj", "gate_proj", "up_proj"),
                                               "model.layers.{bid}.mlp.experts.{wid}.weight"),
                               special_tokens=(("bos", "[gMASK]"), ("eot", "<|user|>"), ("unk", "<|endoftext|>"),
                                               ("eom", "<|observation|>"))),
    # conversion/llama.py SmolLM3Model: LlamaModel with its own architecture name
    "SmolLM3ForCausalLM": Arch(gguf.MODEL_ARCH.SMOLLM3, permute_qk=True, llama_keys=True, tokenizer_prefix_space=True),
    # conversion/olmo.py Olmo2Model: TextModel's keys (+ OLMo 3's sliding window) and GPT-2 style vocabulary
    "Olmo2ForCausalLM": Arch(gguf.MODEL_ARCH.OLMO2, sentencepiece_first=False),
    # conversion/gemma.py Gemma2Model
    "Gemma2ForCausalLM": Arch(gguf.MODEL_ARCH.GEMMA2, gemma2=True),
    # conversion/lfm2.py LFM2Model
    "Lfm2ForCausalLM": Arch(gguf.MODEL_ARCH.LFM2, lfm2="dense"),
    "Lfm2MoeForCausalLM": Arch(gguf.MODEL_ARCH.LFM2MOE, lfm2="moe",
                               experts=Experts("feed_forward.experts", ("w1", "w2", "w3"),
                                               "layers.{bid}.feed_forward.experts.{wid}.weight")),
    # conversion/qwen.py Qwen3NextModel, as with --no-mtp (the multi-token-prediction block, mtp.*, dropped)
    "Qwen3NextForCausalLM": Arch(gguf.MODEL_ARCH.QWEN3NEXT, moe_keys=True, qwen3next=True,
                                 experts=Experts("mlp.experts", ("down_proj", "gate_proj", "up_proj"),
                                                 "model.layers.{bid}.mlp.experts.{wid}.weight")),
    # conversion/minimax.py MiniMaxM2Model: TextModel's keys (the gating from scoring_func), w1 / w2 / w3 stacked
    "MiniMaxM2ForCausalLM": Arch(gguf.MODEL_ARCH.MINIMAXM2, sentencepiece_first=False, minimax_m2=True,
                                 experts=Experts("block_sparse_moe.experts", ("w1", "w2", "w3"),
                                                 "model.layers.{bid}.block_sparse_moe.experts.{wid}.weight")),
    # conversion/llama.py Llama4Model (the text model; the vision tower is skipped by TextModel.filter_tensors)
    "Llama4ForConditionalGeneration": _LLAMA4,
    "Llama4ForCausalLM": _LLAMA4,
    # conversion/granite.py GraniteMoeModel (Granite 3.x MoE): LlamaModel's tensors and keys, JetMoe's
    # merged expert input split into gate and up
    "GraniteMoeForCausalLM": Arch(gguf.MODEL_ARCH.GRANITE_MOE, permute_qk=True, llama_keys=True,
                                  tokenizer_prefix_space=True, granite=True,
                                  splits=(Split("block_sparse_moe.input_linear.weight",
                                                (gguf.MODEL_TENSOR.FFN_GATE_EXP, gguf.MODEL_TENSOR.FFN_UP_EXP)),)),
    # conversion/ernie.py Ernie4_5MoeModel (ERNIE 4.5 MoE): experts stacked gate, up, down; the score bias
    # moe_statics.e_score_correction_bias as exp_probs_b.bias; the multi-token-prediction tensors dropped
    "Ernie4_5_MoeForCausalLM": Arch(gguf.MODEL_ARCH.ERNIE4_5_MOE, ernie_moe=True,
                                    experts=Experts("mlp.experts", ("gate_proj", "up_proj", "down_proj"),
                                                    "model.layers.{bid}.mlp.experts.{wid}.weight"),
                                    skipped=("model.mtp_block.", "model.mtp_emb_norm.", "model.mtp_hidden_norm.",
                                             "model.mtp_linear_proj.")),
    # conversion/deepseek.py DeepseekV2Model (DeepSeek V3 / V3.1 / R1, Kimi K2): experts stacked down, gate, up
    "DeepseekV3ForCausalLM": Arch(gguf.MODEL_ARCH.DEEPSEEK2, sentencepiece_first=False, deepseek2=True,
                                  experts=Experts("mlp.experts", ("down_proj", "gate_proj", "up_proj"),
                                                  "model.layers.{bid}.mlp.experts.{wid}.weight")),
}
#: TextModel.set_gguf_parameters: a config's expert score function as expert_gating_func (llama.cpp's
#: gguf-py ExpertGatingFuncType; the gguf package on PyPI lacks SQRTSOFTPLUS)
_GATING = {"softmax": 1, "sigmoid": 2, "sqrtsoftplus": 4}
#: names the reference drops before mapping (ModelBase.prepare_tensors)
_DROPPED = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
#: TextModel.filter_tensors: the multimodal parts a text model's conversion skips (name prefixes, then parts)
_MULTIMODAL_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                        "sound_projection.", "speech_embeddings.")
_MULTIMODAL_PARTS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.",
                     "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed",
                     "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector.")
#: tensors the reference keeps in F32 whatever the outtype (besides 1-D ones and norms)
_F32_KEYS = (gguf.MODEL_TENSOR.FFN_GATE_INP, gguf.MODEL_TENSOR.FFN_GATE_INP_SHEXP, gguf.MODEL_TENSOR.POS_EMBD,
             gguf.MODEL_TENSOR.TOKEN_TYPES, gguf.MODEL_TENSOR.SSM_CONV1D, gguf.MODEL_TENSOR.SHORTCONV_CONV)


@dataclass
class Source:
    """Where an output tensor's data comes from: one HF tensor, or (experts) one per expert."""

    names: list[str]
    permute: tuple[int, int] | None = None   # (n_head, n_head_kv) for llama's Q/K rows
    values: np.ndarray | None = None         # a tensor the converter makes (llama3's rope_freqs)
    n_rows: int | None = None                # only the first rows (gemma3's embeddings: the real vocabulary)
    shift: float = 0.0                       # added to every value (gemma3's norms: weight + 1)
    rows: np.ndarray | None = None           # only these rows, in this order (qwen3next's attn_qkv / attn_gate)
    neg_exp: bool = False                    # -exp(x) (qwen3next's ssm_a from A_log)
    #: Llama 4's experts, stored [expert, in, out]: each expert's matrix transposed, these columns of it
    transpose: bool = False
    cols: tuple[int, int] | None = None
    part: tuple[int, int] | None = None      # (i, n): the i-th of n equal slices of the next-to-last axis
    #: (n_head, start, stop, transpose): rows start:stop of each head's block of a 2D tensor, as a 3D tensor
    #: of one matrix per head, each transposed or not (DeepseekV2Model's kv_b_proj split)
    heads: tuple[int, int, int, bool] | None = None

    @property
    def whole(self) -> bool:
        """Read at once: the permutation mixes rows within a head, a head split takes rows of every head,
        a row selection (qwen3next) rows anywhere."""
        return self.permute is not None or self.heads is not None or self.rows is not None


@dataclass
class OutTensor:
    name: str
    shape: tuple[int, ...]   # PyTorch order (rows first); the GGUF shape is its reverse
    qtype: T
    source: Source
    src_dtype: str

    @property
    def gguf_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.gguf_shape, self.qtype)


@dataclass
class Plan:
    checkpoint: Checkpoint
    arch: Arch
    hparams: dict
    ftype: FT
    tensors: list[OutTensor]
    kv: list[KV] = field(default_factory=list)
    default_name: str = ""          # llama.cpp's default output file name (gguf.naming_convention)


# -- hyperparameters ---------------------------------------------------------------------------------

def _hparams(config: dict, path: Path) -> dict:
    """config.json with transformers' defaults filled in for the keys the reference reads."""
    if "text_config" in config:
        config = {**config, **config["text_config"]}
    defaults = CONFIG_DEFAULTS.get(config.get("model_type"), CONFIG_DEFAULTS["llama"])
    hp = dict(config)
    for old, new in CONFIG_RENAMES.get(config.get("model_type"), {}).items():
        if old in hp:
            hp[new] = hp.pop(old)
    for k, v in defaults.items():
        if hp.get(k) is None and v is not None:
            hp[k] = v
    for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        if not isinstance(hp.get(k), int) or hp[k] <= 0:
            raise FormatError(f"{path}: {k} must be a positive integer, got {hp.get(k)!r}")
    if hp.get("num_key_value_heads") is None:
        hp["num_key_value_heads"] = hp["num_attention_heads"]
    if hp.get("head_dim") == "derived":
        hp["head_dim"] = hp["hidden_size"] // hp["num_attention_heads"]
    rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    if "full_attention" not in rope and "sliding_attention" not in rope:     # TextModel.__init__'s mirroring
        local = _find(hp, "local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                      "rope_local_base_freq")
        if local is not None:
            rope["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rope and hp.get("rope_theta") is not None:
            rope["rope_theta"] = hp["rope_theta"]
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        if "partial_rotary_factor" not in rope and hp.get("partial_rotary_factor") is not None:
            rope["partial_rotary_factor"] = hp["partial_rotary_factor"]
    hp["rope_parameters"] = rope
    return hp


def _deepseek2_hparams(hp: dict, path: Path) -> None:
    """DeepseekV3Config's derived values (its head_dim is the rotated part, whatever config.json says) and
    the MLA sizes the converter needs, checked."""
    for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"):
        if not isinstance(hp.get(k), int) or hp[k] <= 0:
            raise FormatError(f"{path}: {k} must be a positive integer, got {hp.get(k)!r}")
    hp["head_dim"] = hp["qk_rope_head_dim"]
    hp.setdefault("q_lora_rank", 1536)     # the class's default when the key is absent; null stays (V2-Lite)


def _find(hp: dict, *keys: str):
    """``find_hparam(keys, optional=True)``: the first key present (its value may be None)."""
    return next((hp[k] for k in keys if k in hp), None)


def _n_blocks(hp: dict, arch: Arch) -> int:
    """The file's block count: the layers, and Glm4MoeModel's multi-token-prediction blocks after them."""
    return hp["num_hidden_layers"] + (hp.get("num_nextn_predict_layers") or 0 if arch.glm_moe else 0)


def _add_parameters(w: gguf.GGUFWriter, hp: dict, arch: Arch, ftype: FT, path: Path) -> None:
    """``TextModel.set_gguf_parameters`` and the architecture's additions, in the reference's order."""
    if arch.deepseek2:      # DeepseekV2Model.set_gguf_parameters: MLA is written as MQA, one KV head
        hp = {**hp, "num_key_value_heads": 1}
    if arch.gemma2:
        _add_gemma2_parameters(w, hp, ftype)
        return
    if arch.lfm2:   # LFM2Model.set_gguf_parameters: the attention layers' KV heads, 0 for the convolutions
        hp = {**hp, "num_key_value_heads": [hp["num_key_value_heads"] if t != "conv" else 0
                                            for t in _lfm2_layer_types(hp)]}
    w.add_block_count(_n_blocks(hp, arch))
    if (v := _find(hp, "max_position_embeddings", "n_ctx", "n_positions", "max_length",
                   "max_sequence_length", "model_max_length")) is not None:
        w.add_context_length(v)
    if (v := _find(hp, "hidden_size", "n_embd", "dim")) is not None:
        w.add_embedding_length(v)
    if (v := _find(hp, "prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
                   "n_inner", "hidden_dim")) is not None:
        w.add_feed_forward_length(v)
    if (v := _find(hp, "num_attention_heads", "n_head", "n_heads")) is not None:
        w.add_head_count(v)
    if (v := _find(hp, "num_key_value_heads", "n_kv_heads")) is not None:
        w.add_head_count_kv(v)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rope = hp["rope_parameters"].get("full_attention", hp["rope_parameters"])
    rope_type = rope.get("rope_type")
    if rope_type is not None:
        factor = rope.get("factor")
        lower = str(rope_type).lower()
        if rope_type == "linear" and factor is not None:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(factor)
        elif rope_type == "default" or (lower == "llama3" and arch.llama_keys):
            pass                # no scaling; llama3: rope_freqs.weight (_plan_tensors)
        elif rope_type == "yarn" and factor is not None:
            _add_yarn(w, rope, path)
        elif rope_type in ("su", "longrope", "dynamic") or lower == "llama3":
            raise FormatError(f"{path}: RoPE scaling {rope_type!r} is not converted yet")
        else:   # the reference warns "Unknown RoPE type" (or, for linear without a factor, nothing) and
            # writes no scaling: a file that runs without the scaling the model was trained with
            what = f"{rope_type!r} without a factor" if rope_type in ("linear", "yarn") else f"{rope_type!r}"
            raise FormatError(f"{path}: RoPE scaling {what} is not one llama.cpp's converter writes; "
                              f"converting without it would give a wrong model")
    if (v := rope.get("rope_theta")) is not None:
        w.add_rope_freq_base(v)
    if (v := hp["rope_parameters"].get("sliding_attention", {}).get("rope_theta")) is not None:
        w.add_rope_freq_base_swa(v)
    if (v := _find(hp, "rms_norm_eps", "norm_eps")) is not None:
        w.add_layer_norm_rms_eps(v)
    if (v := _find(hp, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is not None:
        w.add_layer_norm_eps(v)
    if (v := _find(hp, "num_local_experts", "num_experts", "n_routed_experts")) is not None:
        w.add_expert_count(v)
    if (v := _find(hp, "num_experts_per_tok", "num_experts_per_token", "top_k_experts")) is not None:
        w.add_expert_used_count(v)
    if (v := hp.get("n_group")) is not None:
        w.add_expert_group_count(v)
    if (v := hp.get("topk_group")) is not None:
        w.add_expert_group_used_count(v)
    if (v := _find(hp, "score_function", "scoring_func", "score_func", "moe_router_activation",
                   "moe_router_activation_func", "expert_selection_fn")) is not None:
        if v not in _GATING:
            raise FormatError(f"{path}: expert score function {v!r} is not one llama.cpp's converter writes")
        w.add_uint32(gguf.Keys.LLM.EXPERT_GATING_FUNC.format(arch=w.arch), _GATING[v])
    if (v := hp.get("head_dim")) is not None:
        w.add_key_length(v)
        w.add_value_length(v)
    w.add_file_type(ftype)
    if arch.llama_keys:
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
    if arch.gemma3:        # Gemma3Model.set_gguf_parameters: keys set again keep their place
        w.add_context_length(hp.get("max_position_embeddings", 131072))
        w.add_head_count(hp.get("num_attention_heads", 8))
        w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
        w.add_key_length(hp.get("head_dim", 256))
        w.add_value_length(hp.get("head_dim", 256))
        w.add_rope_freq_base(rope.get("rope_theta", 1_000_000.0))
        if hp.get("attn_logit_softcapping") is not None:
            raise FormatError(f"{path}: attn_logit_softcapping is set, but Gemma 3 has none")
        if v := hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(v)
        if hp.get("sliding_window_pattern") != 1:
            w.add_sliding_window(hp["sliding_window"])
        w.add_head_count_kv(hp.get("num_key_value_heads", 4))
    if arch.moe_keys:
        if (v := hp.get("moe_intermediate_size")) is not None:
            w.add_expert_feed_forward_length(v)
        if (v := hp.get("shared_expert_intermediate_size")) is not None:
            w.add_expert_shared_feed_forward_length(v)
    if arch.glm_moe:       # Glm4MoeModel.set_gguf_parameters
        head = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        w.add_rope_dimension_count(int(head * rope.get("partial_rotary_factor", 0.5)))
        if (v := hp.get("n_routed_experts")) is not None:
            w.add_expert_count(v)
        if (v := hp.get("moe_intermediate_size")) is not None:
            w.add_expert_feed_forward_length(v)
        if (v := hp.get("n_shared_experts")) is not None:
            w.add_expert_shared_count(v)
        if (v := hp.get("first_k_dense_replace")) is not None:
            w.add_leading_dense_block_count(v)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if (v := hp.get("routed_scaling_factor")) is not None:
            w.add_expert_weights_scale(v)
        if (v := hp.get("norm_topk_prob")) is not None:
            w.add_expert_weights_norm(v)
        if (v := hp.get("num_nextn_predict_layers")) is not None:
            w.add_nextn_predict_layers(v)
    if arch.granite:       # GraniteModel / GraniteMoeModel.set_gguf_parameters: only the multipliers set (and not 0)
        if v := hp.get("attention_multiplier"):
            w.add_attention_scale(v)
        if v := hp.get("embedding_multiplier"):
            w.add_embedding_scale(v)
        if v := hp.get("residual_multiplier"):
            w.add_residual_scale(v)
        if v := hp.get("logits_scaling"):
            w.add_logit_scale(v)
        if v := hp.get("shared_intermediate_size"):
            w.add_expert_shared_feed_forward_length(v)
    if arch.deepseek2:
        _add_deepseek2_parameters(w, hp)
    if arch.ernie_moe:     # Ernie4_5MoeModel.set_gguf_parameters
        w.add_expert_count(hp["moe_num_experts"])
        w.add_expert_used_count(hp["moe_k"])
        w.add_interleave_moe_layer_step(hp["moe_layer_interval"])
        w.add_leading_dense_block_count(hp["moe_layer_start_index"])
        if (v := hp.get("moe_intermediate_size")) is not None:
            w.add_expert_feed_forward_length(v)
        if (n := hp.get("moe_num_shared_experts")) is not None:
            w.add_expert_shared_count(n)
            # the reference's shared width: the dense FFN width over the KV heads (ERNIE-4.5-21B-A3B:
            # 12288 / 4 = 3072, its 2 shared experts of 1536)
            if n > 0 and hp.get("intermediate_size") is not None and hp.get("num_key_value_heads") is not None:
                w.add_expert_shared_feed_forward_length(hp["intermediate_size"] // hp["num_key_value_heads"])
    if arch.gguf_arch == gguf.MODEL_ARCH.OLMO2 and "sliding_window" in hp:
        _add_olmo3_window(w, hp)
    if arch.qwen3next:      # Qwen3NextModel.set_gguf_parameters (with --no-mtp: no nextn key)
        w.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
        w.add_ssm_state_size(hp["linear_key_head_dim"])
        w.add_ssm_group_count(hp["linear_num_key_heads"])
        w.add_ssm_time_step_rank(hp["linear_num_value_heads"])
        w.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
        if (types := hp.get("layer_types")) is not None:
            if len(types) != hp["num_hidden_layers"]:
                raise FormatError(f"{path}: layer_types has {len(types)} entries, expected num_hidden_layers "
                                  f"({hp['num_hidden_layers']})")
            # GGUFWriter.add_recurrent_layers of llama.cpp's gguf-py (newer than the gguf package's)
            w.add_array(f"{w.arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
        w.add_full_attention_interval(hp.get("full_attention_interval") or 4)
        head = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        w.add_rope_dimension_count(int(head * rope.get("partial_rotary_factor", 0.25)))
    if arch.lfm2 == "dense":   # keys set again keep their place
        w.add_vocab_size(hp["vocab_size"])
        w.add_shortconv_l_cache(hp["conv_L_cache"])
        w.add_layer_norm_rms_eps(hp["norm_eps"])
        w.add_feed_forward_length(lfm2_ff_dim(hp))
    elif arch.lfm2 == "moe":   # LFM2MoeModel.set_gguf_parameters
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
        w.add_leading_dense_block_count(hp["num_dense_layers"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_vocab_size(hp["vocab_size"])
        w.add_shortconv_l_cache(hp["conv_L_cache"])
    if arch.minimax_m2:    # MiniMaxM2Model.set_gguf_parameters
        w.add_expert_feed_forward_length(hp["intermediate_size"])
        if hp.get("rotary_dim") is None:
            raise FormatError(f"{path}: MiniMax-M2 needs rotary_dim (the rotated part of each head)")
        w.add_rope_dimension_count(hp["rotary_dim"])
    if arch.llama4:        # Llama4Model.set_gguf_parameters
        w.add_interleave_moe_layer_step(hp["interleave_moe_layer_step"])
        w.add_expert_feed_forward_length(hp["intermediate_size_moe"])
        if all(t == "full_attention" for t in hp["layer_types"]):
            w.add_sliding_window(0)


def _lfm2_layer_types(hp: dict) -> list[str]:
    """Lfm2Config's layer_types: given, or attention at full_attn_idxs (default: every layer)."""
    if hp.get("layer_types") is not None:
        return list(hp["layer_types"])
    idx = hp.get("full_attn_idxs")
    idx = range(hp["num_hidden_layers"]) if idx is None else idx
    return ["full_attention" if i in idx else "conv" for i in range(hp["num_hidden_layers"])]


def lfm2_ff_dim(hp: dict) -> int:
    """``LFM2Model._add_feed_forward_length``: the MLP's width from intermediate_size (2/3 of it, times the
    multiplier, rounded up to block_multiple_of) when block_auto_adjust_ff_dim."""
    ff = _find(hp, "block_ff_dim", "intermediate_size")
    if hp["block_auto_adjust_ff_dim"]:
        ff = int(2 * ff / 3)
        if hp.get("block_ffn_dim_multiplier") is not None:
            ff = int(hp["block_ffn_dim_multiplier"] * ff)
        m = hp["block_multiple_of"]
        ff = m * ((ff + m - 1) // m)
    return ff


def llama4_hparams(hp: dict) -> dict:
    """``Llama4Model.__init__`` on transformers' ``Llama4TextConfig``: ``intermediate_size`` is the experts'
    width and ``intermediate_size_mlp`` the dense layers' (the reference swaps them so TextModel writes the
    dense one); ``layer_types`` derived as the config class derives it when config.json has none (a NoPE
    layer every ``no_rope_layer_interval``-th, the others chunked unless ``attention_chunk_size`` is null)."""
    hp = {**hp, "intermediate_size_moe": hp["intermediate_size"], "intermediate_size": hp["intermediate_size_mlp"]}
    if not hp.get("layer_types"):
        n = hp["num_hidden_layers"]
        no_rope = hp.get("no_rope_layers") or [int((i + 1) % hp["no_rope_layer_interval"] != 0) for i in range(n)]
        chunked = hp.get("attention_chunk_size", 8192) is not None     # absent: the class's 8192; null: none
        hp["layer_types"] = ["chunked_attention" if r and chunked else "full_attention" for r in no_rope]
    return hp


def _add_deepseek2_parameters(w: gguf.GGUFWriter, hp: dict) -> None:
    """``DeepseekV2Model.set_gguf_parameters``, after TextModel's keys (written with one KV head)."""
    has_moe = hp.get("n_routed_experts") is not None
    lead = hp.get("first_k_dense_replace")
    w.add_leading_dense_block_count(lead if lead is not None else 0 if has_moe else hp["num_hidden_layers"])
    kv_lora = hp.get("kv_lora_rank", 512)
    w.add_vocab_size(hp["vocab_size"])
    if hp.get("q_lora_rank") is not None:
        w.add_q_lora_rank(hp["q_lora_rank"])
    # MLA as MQA: one KV head of the latent and the rotated part, decompressed per head by attn_k_b / attn_v_b
    w.add_kv_lora_rank(kv_lora)
    w.add_key_length(kv_lora + hp["qk_rope_head_dim"])
    w.add_value_length(kv_lora)
    w.add_key_length_mla(hp["qk_nope_head_dim"] + hp["qk_rope_head_dim"])
    w.add_value_length_mla(hp["v_head_dim"])
    w.add_expert_feed_forward_length(_find(hp, "moe_intermediate_size", "intermediate_size"))
    if has_moe:
        w.add_expert_count(hp["n_routed_experts"])
    w.add_expert_shared_count(hp.get("n_shared_experts", 0))
    if (v := hp.get("routed_scaling_factor")) is not None:
        w.add_expert_weights_scale(v)
    if hp.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(hp["qk_rope_head_dim"])
    if (v := hp["rope_parameters"].get("mscale_all_dim")) is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * v)    # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]


def _add_yarn(w: gguf.GGUFWriter, rope: dict, path: Path) -> None:
    """TextModel.set_gguf_parameters' YaRN keys: the factor, the original context, and the
    extrapolation / attention factors and betas where the config sets them."""
    if not isinstance(rope.get("original_max_position_embeddings"), int):
        raise FormatError(f"{path}: YaRN RoPE scaling without original_max_position_embeddings")
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if (v := rope.get("extrapolation_factor")) is not None:
        w.add_rope_scaling_yarn_ext_factor(v)
    if (v := rope.get("attention_factor", rope.get("attn_factor"))) is not None:
        w.add_rope_scaling_yarn_attn_factor(v)
    if (v := rope.get("beta_fast")) is not None:
        w.add_rope_scaling_yarn_beta_fast(v)
    if (v := rope.get("beta_slow")) is not None:
        w.add_rope_scaling_yarn_beta_slow(v)


def _add_olmo3_window(w: gguf.GGUFWriter, hp: dict) -> None:
    """``Olmo2Model.set_gguf_parameters``: OLMo 3's sliding window and its per-layer pattern (from
    ``layer_types``, else every fourth layer global)."""
    w.add_sliding_window(hp["sliding_window"])
    if "layer_types" in hp:
        pattern = [t == "sliding_attention" for t in hp["layer_types"]]
    else:
        pattern = [(i + 1) % 4 != 0 for i in range(hp["num_hidden_layers"])]
    w.add_sliding_window_pattern(pattern)


def _add_gemma2_parameters(w: gguf.GGUFWriter, hp: dict, ftype: FT) -> None:
    """``Gemma2Model.set_gguf_parameters`` (it does not call TextModel's: no RoPE base is written)."""
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)
    w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
    w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_sliding_window(hp["sliding_window"])


# -- tensors -------------------------------------------------------------------------------------------

def _bid(name: str) -> int | None:
    """The first number-like part of a tensor name: its block id (as the reference takes it)."""
    return next((int(p) for p in name.split(".") if p.isdecimal()), None)


def output_type(name: str, n_dims: int, ftype: FT, arch: Arch, bid: int | None) -> T:
    """The reference's type rule (``ModelBase.prepare_tensors``): 1-D tensors, norms and a few kinds
    (router, position embeddings) F32; the rest the file type's, Q8_0 falling back to F16 on rows that
    are not whole blocks."""
    if n_dims <= 1 or name.endswith("_norm.weight"):
        return T.F32
    for key in _F32_KEYS:
        if key in gguf.MODEL_TENSORS[arch.gguf_arch]:
            base = gguf.TENSOR_NAMES[key]
            if name == (base.format(bid=bid) if "{bid}" in base else base) + ".weight":
                return T.F32
    if name[-7:] != ".weight":
        return T.F32
    return _FT_TYPE[ftype]


def _expected_shapes(hp: dict) -> dict[str, tuple[int, ...]]:
    """What the config says some tensors must measure (PyTorch order), by GGUF name without the block."""
    e, v = hp["hidden_size"], hp["vocab_size"]
    hd = hp.get("head_dim") or e // hp["num_attention_heads"]
    out = {"token_embd.weight": (v, e), "output.weight": (v, e),
           "attn_q.weight": (hp["num_attention_heads"] * hd, e),
           "attn_k.weight": (hp["num_key_value_heads"] * hd, e), "attn_v.weight": (hp["num_key_value_heads"] * hd, e)}
    if isinstance(hp.get("intermediate_size"), int):      # dense layers (a MoE's experts are ffn_*_exps)
        out["ffn_up.weight"] = (hp["intermediate_size"], e)
    return out


def _check_shape(t: OutTensor, want: dict, path: Path) -> None:
    key = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
    if key in want and tuple(t.shape) != want[key]:
        raise FormatError(f"{path}: tensor {t.source.names[0]!r} ({t.name}) has shape {list(t.shape)}, but "
                          f"config.json says {list(want[key])}")


def resolve_auto(ck: Checkpoint) -> FT:
    """``--outtype auto``: BF16 or F16 after the first tensor of two or more dimensions, else F16."""
    for t in ck.tensors.values():
        if len(t.shape) < 2:
            continue
        if t.dtype == "BF16":
            return FT.MOSTLY_BF16
        if t.dtype == "F16":
            return FT.MOSTLY_F16
        break
    return FT.MOSTLY_F16


def _plan_tensors(ck: Checkpoint, arch: Arch, hp: dict, ftype: FT) -> list[OutTensor]:
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(arch.gguf_arch, _n_blocks(hp, arch))
    path = ck.folder
    n_head, n_kv = hp["num_attention_heads"], hp["num_key_value_heads"]
    n_expert = _find(hp, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts") or 0
    groups: dict[int, list[str]] = {}
    out: list[OutTensor] = []
    if arch.llama_keys and (hp["rope_parameters"].get("rope_type") or "").lower() == "llama3":
        factors = llama3_rope_factors(hp)           # generate_extra_tensors: first in the file
        out.append(OutTensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors.shape, T.F32,
                             Source([], values=factors), "F32"))

    def add(hf_name: str, shape: tuple[int, ...], source: Source, dtype: str, bid: int | None,
            new: str | None = None) -> None:
        if hf_name.endswith("e_score_correction_bias"):   # ModelBase.filter_tensors (DeepSeek V3's router bias)
            hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        hf_name = hf_name.replace("language_model.", "")  # ModelBase.filter_tensors (multimodal checkpoints)
        if arch.lfm2 == "moe" and hf_name.endswith(".expert_bias"):     # LFM2MoeModel.filter_tensors
            hf_name = hf_name.replace(".expert_bias", ".expert_bias.bias")
        new = new or tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise FormatError(f"{path}: cannot map tensor {hf_name!r} to a GGUF name "
                              f"({arch.gguf_arch.name.lower()} has no such tensor)")
        qtype = output_type(new, len(shape), ftype, arch, bid)
        if qtype == T.Q8_0 and shape[-1] % 32:
            qtype = T.F16   # gguf.quants.quantize's QuantError: the reference falls back to F16
        out.append(OutTensor(new, tuple(shape), qtype, source, dtype))

    for name, t in ck.tensors.items():
        if (name.endswith(_DROPPED) or name.startswith(arch.skipped or "\0") or name.startswith(_MULTIMODAL_PREFIXES)
                or any(p in name for p in _MULTIMODAL_PARTS)):
            continue
        bid = _bid(name)
        if arch.deepseek2 and (name.startswith("model.layers.") and bid is not None and bid >= n_layer
                               or hp.get("tie_word_embeddings") and name in ("lm_head.weight", "model.lm_head.weight")):
            continue            # DeepseekV2Model.modify_tensors: the MTP layers, a tied lm_head
        if t.dtype not in FLOAT_DTYPES:
            raise FormatError(f"{t.file}: tensor {name!r} is {t.dtype}; only float tensors are converted "
                              f"(quantized checkpoints are not)")
        ex = arch.experts
        if ex and ex.key in name:
            if not n_expert or bid is None:
                raise FormatError(f"{path}: tensor {name!r} is an expert's, but config.json gives no expert count")
            groups.setdefault(bid, []).append(name)
            if len(groups[bid]) < n_expert * 3:
                continue
            for wid in ex.projections:
                names = [f"model.layers.{bid}.{ex.key}.{x}.{wid}.weight" for x in range(n_expert)]
                missing = [n for n in names if n not in ck.tensors]
                if missing:
                    raise FormatError(f"{path}: layer {bid} lacks expert tensor {missing[0]!r}")
                shapes = {ck.tensors[n].shape for n in names}
                if len(shapes) != 1:
                    raise FormatError(f"{path}: layer {bid}'s {wid} experts differ in shape: {sorted(shapes)}")
                add(ex.merged.format(bid=bid, wid=wid), (n_expert, *shapes.pop()), Source(names),
                    ck.tensors[names[0]].dtype, bid)
            continue
        if arch.llama4 and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            for hf_name, shape, src in _llama4_experts(name, t.shape, path):
                add(hf_name, shape, src, t.dtype, bid)
            continue
        split = next((sp for sp in arch.splits if name.endswith(sp.suffix)), None)
        if split is not None:
            n = len(split.parts)
            if len(t.shape) < 2 or t.shape[-2] % n:
                raise FormatError(f"{t.file}: tensor {name!r} has shape {list(t.shape)}, not {n} equal parts of "
                                  f"its rows")
            shape = (*t.shape[:-2], t.shape[-2] // n, t.shape[-1])
            for i, part in enumerate(split.parts):
                base = gguf.TENSOR_NAMES[part]
                add(base.format(bid=bid) + ".weight", shape, Source([name], part=(i, n)), t.dtype, bid)
            continue
        if arch.deepseek2 and name.endswith("kv_b_proj.weight"):
            _split_kv_b(name, t, hp, add, bid)
            continue
        permute = None
        if arch.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            permute = (n_head, n_head)
        elif arch.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            permute = (n_head, n_kv)
        if permute is not None:
            heads = permute[1] if permute[0] != permute[1] else permute[0]
            if t.shape[0] % (2 * heads):
                raise FormatError(f"{t.file}: tensor {name!r} has {t.shape[0]} rows, not a multiple of 2 x {heads} "
                                  f"heads (config.json)")
        shape, src = t.shape, Source([name], permute)
        if arch.gemma3 and "embed_tokens.weight" in name:
            # Gemma3Model.modify_tensors: rows past the real vocabulary go
            shape = (min(shape[0], vocab_rows(ck, hp)), *shape[1:])
        if (arch.gemma3 or arch.gemma2) and name.endswith("norm.weight"):   # Gemma's RMSNorm scales by 1 + weight
            src.shift = 1.0
        if arch.lfm2 and "conv.conv" in name and len(shape) == 3 and shape[1] == 1:
            shape = (shape[0], shape[2])    # LFM2Model.modify_tensors: squeeze(1), the same bytes
        if arch.qwen3next:
            if name.startswith(("mtp.", "model.mtp.")):     # --no-mtp
                continue
            for hf, shp, s2, new in _qwen3next_sources(name, shape, src, hp, bid):
                add(hf, shp, s2, t.dtype, bid, new)
            continue
        add(name, shape, src, t.dtype, bid)
    leftover = [n for names in groups.values() for n in names if len(names) < n_expert * 3]
    if leftover:
        raise FormatError(f"{path}: unprocessed expert tensor {leftover[0]!r} (its layer lacks some experts)")
    want = _expected_shapes(hp)
    if arch.lfm2 == "dense":
        want["ffn_up.weight"] = (lfm2_ff_dim(hp), hp["hidden_size"])
    if arch.qwen3next:      # attn_q makes each head's query and its output gate
        q = want["attn_q.weight"]
        want["attn_q.weight"] = (2 * q[0], q[1])
    if arch.deepseek2:
        want["attn_q.weight"] = (n_head * (hp["qk_nope_head_dim"] + hp["qk_rope_head_dim"]), hp["hidden_size"])
    if arch.gemma3:
        want["token_embd.weight"] = (min(hp["vocab_size"], vocab_rows(ck, hp)), hp["hidden_size"])
    for t in out:
        _check_shape(t, want, path)
    if n_layer and not any(t.name.startswith(f"blk.{n_layer - 1}.") for t in out):
        raise FormatError(f"{path}: config.json says {n_layer} layers, but no tensor of layer {n_layer - 1}")
    return out


def _qwen3next_sources(name: str, shape: tuple[int, ...], src: Source, hp: dict, bid: int | None):
    """``Qwen3NextModel.modify_tensors``: (HF name to map, shape, source, GGUF name or None) per output.
    ``A_log`` becomes ``-exp(A_log)`` (ssm_a), ``dt_bias`` maps as ``dt_proj.bias``, the convolution's
    (channels, 1, taps) is squeezed, every norm but the DeltaNet's gated one is stored + 1 (zero-centred
    RMSNorm), and ``in_proj_qkvz`` -- per key head [q, k, v, z] -- is split into attn_qkv (every head's q,
    then every k, then every v) and attn_gate (every z)."""
    if name.endswith(".A_log"):
        yield name, shape, Source(src.names, neg_exp=True), None
    elif name.endswith(".dt_bias"):
        yield name.rpartition(".dt_bias")[0] + ".dt_proj.bias", shape, src, None
    elif "conv1d" in name:
        yield name, tuple(d for d in shape if d != 1), src, None
    elif "in_proj_qkvz.weight" in name:
        dk, dv = hp["linear_key_head_dim"], hp["linear_value_head_dim"]
        nk, nv = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
        r = nv // nk
        per = 2 * dk + 2 * r * dv
        if shape[0] != nk * per:
            raise FormatError(f"tensor {name!r} has {shape[0]} rows, config.json says {nk} x {per}")
        base = np.arange(nk)[:, None] * per
        part = [(0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv)]      # q, k, v, z in a head
        idx = [(base + off + np.arange(n)[None, :]).reshape(-1) for off, n in part]
        qkv, z = np.concatenate(idx[:3]), idx[3]
        yield name, (qkv.size, shape[1]), Source(src.names, rows=qkv), \
            gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ATTN_QKV].format(bid=bid) + ".weight"
        yield name, (z.size, shape[1]), Source(src.names, rows=z), \
            gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ATTN_GATE].format(bid=bid) + ".weight"
    else:
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            src.shift = 1.0
        yield name, shape, src, None


def _llama4_experts(name: str, shape: tuple[int, ...], path: Path) -> list[tuple[str, tuple[int, ...], Source]]:
    """``Llama4Model.modify_tensors``: ``gate_up_proj`` [experts, hidden, 2 x width] transposed and split in
    halves (gate first, then up, both written where it was); ``down_proj`` [experts, width, hidden] transposed."""
    if len(shape) != 3 or (name.endswith("gate_up_proj") and shape[2] % 2):
        raise FormatError(f"{path}: tensor {name!r} has shape {list(shape)}; Llama 4's experts are "
                          f"[experts, in, out] with gate_up_proj's out even")
    n_x, n_in, n_out = shape
    if name.endswith("down_proj"):
        return [(name + ".weight", (n_x, n_out, n_in), Source([name], transpose=True))]
    half = n_out // 2
    return [(name.replace("gate_up_proj", "gate_proj.weight"), (n_x, half, n_in), Source([name], transpose=True, cols=(0, half))),
            (name.replace("gate_up_proj", "up_proj.weight"), (n_x, half, n_in),
             Source([name], transpose=True, cols=(half, n_out)))]


def _split_kv_b(name: str, t, hp: dict, add, bid: int | None) -> None:
    """``DeepseekV2Model.modify_tensors``: each head's rows of ``kv_b_proj`` (its nope key rows, then its
    value rows, over the latent) as ``attn_k_b`` (per head the key rows transposed: latent x nope) and
    ``attn_v_b`` (per head value x latent), for MLA's absorbed form."""
    n_head, nope, vd = hp["num_key_value_heads"], hp["qk_nope_head_dim"], hp["v_head_dim"]
    if len(t.shape) != 2 or t.shape[0] != n_head * (nope + vd):
        raise FormatError(f"{t.file}: tensor {name!r} has shape {list(t.shape)}, but config.json says "
                          f"[{n_head * (nope + vd)}, kv_lora_rank] ({n_head} heads of {nope} + {vd} rows)")
    kv = t.shape[1]
    add(name.replace("kv_b_proj", "k_b_proj"), (n_head, kv, nope), Source([name], heads=(n_head, 0, nope, True)),
        t.dtype, bid)
    add(name.replace("kv_b_proj", "v_b_proj"), (n_head, vd, kv), Source([name], heads=(n_head, nope, nope + vd, False)),
        t.dtype, bid)


def llama3_rope_factors(hp: dict) -> np.ndarray:
    """``LlamaModel.generate_extra_tensors``: Llama 3's per-frequency RoPE scaling factors, float32.

    The reference computes in torch float32. Two of its operations are reproduced as torch does them:
    ``2 * pi / freq`` is a reciprocal times the scalar (torch's scalar-over-tensor division), and the
    power ``base ** (i / dim)`` -- torch's vectorized powf, not correctly rounded -- is taken here in
    float64 and rounded. On Llama 3.x's settings (base 500000, head size 64 or 128, factor 8 or 32,
    original context 8192) the bytes are the reference's; on other bases and head sizes a factor in
    the smooth band can differ in its last bit (a grid of 60 settings: 41 had one to five such values).
    """
    import math

    f32 = np.float32
    rope = hp["rope_parameters"]
    base = rope.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    factor = rope.get("factor", 8.0)
    lo, hi = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    exps = np.arange(0, dim, 2, dtype=f32) / f32(dim)
    freqs = f32(1.0) / (np.float64(base) ** exps.astype(np.float64)).astype(f32)
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) * (f32(1) / freq)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (f32(old) / wavelen - f32(lo)) / f32(hi - lo)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=f32)


def vocab_rows(ck: Checkpoint, hp: dict) -> int:
    """Gemma 3's real vocabulary: the SentencePiece vocabulary padded to the config's size, or
    tokenizer.json's vocabulary plus its added tokens."""
    if (ck.folder / "tokenizer.model").is_file():
        return hp["vocab_size"]
    tj = ck.json("tokenizer.json")
    try:
        return len(tj["model"]["vocab"]) + len(tj["added_tokens"])
    except (TypeError, KeyError):
        raise FormatError(f"{ck.folder / 'tokenizer.json'}: missing, or without model.vocab and added_tokens") from None


def _permute(x: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """``LlamaModel.permute``: Hugging Face's rotate-half Q/K rows back to GGML's interleaved pairs."""
    if n_head != n_head_kv:
        n_head = n_head_kv
    return (x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape))


def _read(ck: Checkpoint, src: Source, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows of a source tensor as the reference holds them before quantizing: anything but F16 / F32
    as float32 (``prepare_tensors``), then the architecture's adjustment (``modify_tensors``)."""
    x = ck.rows(name, start, stop)
    if x.dtype not in (np.float16, np.float32):
        x = x.astype(np.float32)
    if src.part is not None:
        i, n = src.part
        rows = x.shape[-2] // n
        x = x[..., i * rows:(i + 1) * rows, :]
    if src.shift:
        x = x + x.dtype.type(src.shift)
    if src.permute is not None:
        x = _permute(x, *src.permute)
    if src.rows is not None:
        x = x[src.rows]
    if src.neg_exp:     # torch's exp in the working dtype (an F16 source stays F16: computed in float32, then
        # rounded to half); torch's float32 exp as near as numpy gets: exp in float64, rounded (equal to torch's
        # on 99 % of normal(0, 3) inputs, where numpy's float32 exp is on 60 %; measured 2026-12-07)
        x = -np.exp(x.astype(np.float64)).astype(np.float32).astype(x.dtype)
    if src.heads is not None:
        n_head, a, b, transpose = src.heads
        x = x.reshape(n_head, -1, x.shape[-1])[:, a:b, :]
        x = np.ascontiguousarray(x.transpose(0, 2, 1) if transpose else x)
    return x


def _encode(x: np.ndarray, qtype: T) -> np.ndarray:
    """Float16 / float32 data as ``qtype`` bytes (gguf.quants.quantize's results)."""
    if qtype == T.F32:
        return x.astype(np.float32, copy=False)
    if qtype == T.F16:
        return x.astype(np.float16, copy=False)
    from quantkit.quants import codecs

    return codecs.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype)


def tensor_chunks(ck: Checkpoint, t: OutTensor) -> Iterator[np.ndarray]:
    """The output bytes of ``t``, in order, a bounded piece at a time."""
    src = t.source
    if src.values is not None:
        yield _encode(src.values, t.qtype)
        return
    if src.transpose:                           # Llama 4's experts: one expert at a time
        for x in range(t.shape[0]):
            a = _read(ck, src, src.names[0], x, x + 1)[0]
            if src.cols is not None:
                a = a[:, src.cols[0]:src.cols[1]]
            yield _encode(np.ascontiguousarray(a.T), t.qtype)
        return
    if len(src.names) > 1:                      # stacked experts: one expert at a time
        for n in src.names:
            yield _encode(_read(ck, src, n), t.qtype)
        return
    # a 2D split's parts are row ranges: the whole tensor too
    if src.whole or len(t.shape) < 2 or (src.part is not None and len(t.shape) < 3):
        yield _encode(_read(ck, src, src.names[0]), t.qtype)
        return
    shape = t.shape
    row = int(np.prod(shape[1:])) * 4
    step = max(1, CHUNK_BYTES // max(1, row))
    for start in range(0, shape[0], step):
        yield _encode(_read(ck, src, src.names[0], start, min(shape[0], start + step)), t.qtype)


# -- the plan ----------------------------------------------------------------------------------------

def plan_conversion(folder: str | os.PathLike, outtype: str = "auto") -> Plan:
    """Everything about the output, checked, before a byte is written."""
    ck = Checkpoint(folder)
    path = ck.folder / "config.json"
    archs = ck.config.get("architectures") or []
    name = archs[0] if archs else None
    if name not in ARCHS:
        raise FormatError(f"{path}: architecture {name!r} is not converted by quantkit (it converts: "
                          f"{', '.join(ARCHS)})")
    arch = ARCHS[name]
    hp = _hparams(ck.config, path)
    if arch.llama4:
        hp = llama4_hparams(hp)
    if arch.granite:
        hp.pop("head_dim", None)      # GraniteModel.set_gguf_parameters ignores it
    if arch.deepseek2:
        _deepseek2_hparams(hp, path)
    if name == "Qwen3ForCausalLM" and any("qwen3-reranker" in str(h).lower() for h in
                                          (ck.folder.name, hp.get("_name_or_path", ""))):
        raise FormatError(f"{ck.folder}: Qwen3 reranker models are not converted yet")
    if outtype == "auto":
        ftype = resolve_auto(ck)
    elif outtype in OUTTYPES:
        ftype = OUTTYPES[outtype]
    else:
        raise FormatError(f"unknown outtype {outtype!r} (f32, f16, bf16, q8_0 or auto)")
    tensors = _plan_tensors(ck, arch, hp, ftype)
    plan = Plan(ck, arch, hp, ftype, tensors)
    plan.kv, plan.default_name = _metadata(plan)
    return plan


def _metadata(plan: Plan) -> tuple[list[KV], str]:
    """Every KV pair, in the order ``ModelBase.prepare_metadata`` + ``TextModel.prepare_metadata`` add
    them, on an in-memory GGUFWriter whose tensor infos make gguf-py's parameter count. gguf-py's
    warnings (a key set twice, as Gemma 3's parameters do on purpose) are not shown."""
    log = logging.getLogger("gguf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return _metadata_kv(plan)
    finally:
        log.setLevel(level)


def _metadata_kv(plan: Plan) -> tuple[list[KV], str]:
    from quantkit.pipelines.convert_vocab import add_vocab, add_vocab_sentencepiece

    ck, hp = plan.checkpoint, plan.hparams
    w = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[plan.arch.gguf_arch])
    for t in plan.tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), int(np.prod(t.shape)) * 4)
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, ck.folder, None, total)
    gen = ck.json("generation_config.json") or {}
    if meta.sampling_penalty_repeat is None and "repetition_penalty" in gen:
        meta.sampling_penalty_repeat = gen["repetition_penalty"]   # llama.cpp 0c1e570's gguf-py reads it
    if meta.name is None:
        meta.name = ck.folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    _add_parameters(w, hp, plan.arch, plan.ftype, ck.folder / "config.json")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok_cfg = ck.json("tokenizer_config.json")
    if plan.arch.tokenizer_prefix_space and isinstance(tok_cfg, dict):
        if (v := tok_cfg.get("add_prefix_space")) is not None:
            w.add_add_space_prefix(v)
    if plan.arch.ernie_moe:    # Ernie4_5Model.set_vocab: _set_vocab_sentencepiece, then add_prefix_space
        if not (ck.folder / "tokenizer.model").is_file():
            raise FormatError(f"{ck.folder / 'tokenizer.model'}: missing (ERNIE 4.5's vocabulary is read from its "
                              f"SentencePiece model only, as the reference's set_vocab does)")
        add_vocab_sentencepiece(w, ck.folder, hp.get("vocab_size"))
        if isinstance(tok_cfg, dict) and "add_prefix_space" in tok_cfg:
            w.add_add_space_prefix(tok_cfg["add_prefix_space"])
    elif plan.arch.sentencepiece_first and (ck.folder / "tokenizer.model").is_file():
        add_vocab_sentencepiece(w, ck.folder, hp.get("vocab_size"))
        if plan.arch.gemma3 or plan.arch.gemma2:
            w.add_add_space_prefix(False)
    else:
        add_vocab(w, ck.folder, hp.get("vocab_size"), plan.arch.special_tokens)
    if plan.arch.llama_keys and not plan.arch.llama4 and hp.get("vocab_size") == 49152:   # LlamaModel.set_vocab: granite-small vocabularies
        w.add_add_bos_token(False)
    kv = [KV(k, v.value, v.type, v.sub_type) for k, v in w.kv_data[0].items()]
    out_name = plan.ftype.name.partition("_")[2]
    default = gguf.naming_convention(meta.name, meta.basename, meta.finetune, meta.version, meta.size_label,
                                     out_name) + ".gguf"
    return kv, default


def convert(folder: str | os.PathLike, out: str | os.PathLike | None = None, outtype: str = "auto",
            log: Callable[[str], None] = lambda s: None, progress=None) -> Path:
    """Convert the checkpoint in ``folder``; returns the path written (``out``, or llama.cpp's default
    name inside ``folder``). ``progress(total=, unit=, desc=)`` makes a tqdm-like bar (bytes)."""
    plan = plan_conversion(folder, outtype)
    dst = Path(out) if out is not None else plan.checkpoint.folder / plan.default_name
    log(f"{plan.checkpoint.folder}: {plan.arch.gguf_arch.name.lower()}, {len(plan.tensors)} tensors, "
        f"file type {plan.ftype.name} -> {dst}")
    gtensors = [Tensor(t.name, t.gguf_shape, t.qtype) for t in plan.tensors]
    bar = progress(total=sum(t.nbytes for t in plan.tensors), unit="B", unit_scale=True,
                   desc="convert") if progress else None
    try:
        with GGUFOutput(dst, plan.kv, gtensors) as w:
            for t in plan.tensors:
                w.write_parts(t.name, tensor_chunks(plan.checkpoint, t))
                if bar is not None:
                    bar.update(t.nbytes)
            w.commit()
    finally:
        if bar is not None:
            bar.close()
        plan.checkpoint.close()
    return dst
