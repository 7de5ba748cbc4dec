"""Which ggml type each tensor gets: llama.cpp's ``llama_tensor_get_type`` as a pure function.

The rules follow ``src/llama-quant.cpp`` of llama.cpp (the function each part follows is named where it
is implemented). Nothing here does I/O or imports numba:
the inputs are the GGUF metadata (plain values), the tensor list ``(name, shape, type)`` with GGUF
shapes (``ne0`` first) and the user's options; the output is one record per tensor.

Entry points:

* ``plan_types(...)``   -> ``TypePlan``: per tensor the source and target type, whether a
  ``--tensor-type`` pattern decided it, whether the shape fallback (``tensor_type_fallback``) fired and from which type,
  whether the target needs an imatrix (``llama_model_quantize_impl``'s check), in llama.cpp's
  processing order (the model loader's tensor order).
* ``choose_types(...)`` -> ``{name: GGMLQuantizationType}``, the same decision as a dict.
* ``check_loadable``: the hyperparameters llama.cpp needs to load the model at all.
* ``is_70b``, ``use_more_bits``: the two model-shape predicates the mixture rules use.

The names these take (file types, ggml type names, ``--tensor-type`` arguments) are parsed by
``quantkit.typenames``.

Every file type llama-quantize offers is planned (``typenames.FILE_TYPES``, in its order), with the
mixture rules of each, including the Falcon variants and the importance-matrix requirement of the 1- and
2-bit IQ types; Q2_0 is refused in one line (``typenames.REFUSED_FTYPES``: gguf-py cannot write the type). Whether quantkit has a
codec for every type a plan names is the quantize pipeline's check, not this module's: the rules are
tested against llama-quantize's choices without any codec.
"""

from __future__ import annotations

import re

import numpy as np
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gguf import GGMLQuantizationType

from quantkit.errors import PolicyError
from quantkit.formats.ggml_types import type_info
from quantkit.typenames import FileType, block_size, compile_pattern, ggml_type_name, parse_ftype, parse_ggml_type

Q = GGMLQuantizationType


class NoFallbackError(PolicyError):
    """A tensor's row length does not fit its target type and no fallback type is defined (``tensor_type_fallback``)."""


# ---------------------------------------------------------------------------------------------
# Model facts (what ``llama_model_quantize_impl`` counts before choosing)
# ---------------------------------------------------------------------------------------------


def _as_int(key: str, value: Any) -> int:
    """A metadata integer; anything else (a string, a float, a bool) is a one-line PolicyError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PolicyError(f"metadata key {key} must be an integer, got {type(value).__name__} {value!r:.40}")
    return int(value)


def _layer0(value: Any, key: str = "head count") -> int:
    """Head counts may be per-layer arrays; llama.cpp's n_head()/n_head_kv() read layer 0."""
    if value is None:
        return 0
    if isinstance(value, (list, tuple, np.ndarray)):
        return _as_int(key, value[0]) if len(value) else 0
    return _as_int(key, value)


# Architectures whose "70B" model type is a function of the layer count only (src/models/*.cpp).
_LAYERS_70B: dict[str, int] = {"qwen2": 80, "olmo": 80, "deci": 80, "jais2": 68}


def is_70b(arch: str, n_layer: int, n_head: int, n_head_kv: int, n_expert: int) -> bool:
    """llama.cpp's ``model.type == LLM_TYPE_70B`` for the architectures that have it."""
    if arch == "llama":
        return n_layer == 80 and n_head != n_head_kv and n_expert != 8
    return _LAYERS_70B.get(arch) == n_layer


def use_more_bits(i: int, n: int) -> bool:
    """The layers that get more bits: the first and last eighth, and every third in between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


#: keys llama.cpp's ``load_hparams`` reads without a default, for every architecture (integers) and for
#: some architectures; ``llama_model_quantize`` loads them before anything else
REQUIRED_HPARAMS: tuple[str, ...] = ("context_length", "embedding_length", "block_count")
REQUIRED_BY_ARCH: dict[str, tuple[str, ...]] = {"llama": ("attention.layer_norm_rms_epsilon",)}


def check_loadable(metadata: Mapping[str, Any]) -> None:
    """PolicyError if llama.cpp could not load the model's hyperparameters (so llama-quantize refuses
    the file): a required key missing, or an integer one that is not an integer. The type rules
    themselves read fewer keys (``ModelFacts``)."""
    arch = metadata.get("general.architecture")
    if not arch:
        raise PolicyError("model metadata lacks general.architecture")
    for name in REQUIRED_HPARAMS + REQUIRED_BY_ARCH.get(str(arch), ()):
        if metadata.get(f"{arch}.{name}") is None:
            raise PolicyError(f"model metadata lacks {arch}.{name} (llama.cpp cannot load the model without it)")
    for name in REQUIRED_HPARAMS:
        _as_int(f"{arch}.{name}", metadata[f"{arch}.{name}"])


@dataclass(frozen=True)
class ModelFacts:
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> "ModelFacts":
        arch = metadata.get("general.architecture")
        if isinstance(arch, bytes):
            arch = arch.decode()
        if not arch:
            raise PolicyError("model metadata lacks general.architecture")

        def key(name: str) -> Any:
            return metadata.get(f"{arch}.{name}")

        if key("block_count") is None:
            raise PolicyError(f"model metadata lacks {arch}.block_count")
        kv_name = "attention.head_count_kv" if key("attention.head_count_kv") is not None else "attention.head_count"
        return cls(
            arch=str(arch),
            n_layer=_as_int(f"{arch}.block_count", key("block_count")),
            n_head=_layer0(key("attention.head_count"), f"{arch}.attention.head_count"),
            n_head_kv=_layer0(key(kv_name), f"{arch}.{kv_name}"),
            n_expert=_as_int(f"{arch}.expert_count", key("expert_count") or 0),
        )

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        return is_70b(self.arch, self.n_layer, self.n_head, self.n_head_kv, self.n_expert)

    @property
    def is_falcon(self) -> bool:
        return self.arch == "falcon"


# ---------------------------------------------------------------------------------------------
# Eligibility (``tensor_allows_quantization``) and categories (by tensor name)
# ---------------------------------------------------------------------------------------------

_NEVER_QUANTIZED_SUBSTRINGS: tuple[str, ...] = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
)
_NEVER_QUANTIZED_NAMES = frozenset({"position_embd.weight", "token_types.weight"})


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of size 1 do not count; at least 1."""
    dims = [int(d) for d in shape]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return max(len(dims), 1)


def tensor_allows_quantization(name: str, shape: Sequence[int], *, leave_output_tensor: bool = False) -> bool:
    """``tensor_allows_quantization`` for a non-COPY file type."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if leave_output_tensor and name == "output.weight":
        return False
    if name in _NEVER_QUANTIZED_NAMES:
        return False
    return not any(s in name for s in _NEVER_QUANTIZED_SUBSTRINGS)


OUTPUT, TOKEN_EMBD, QKV, KV_B, V, K, Q_, ATTN_OUT, FFN_UP, FFN_GATE, FFN_DOWN, OTHER = (
    "output", "token_embd", "attn_qkv", "attn_kv_b", "attn_v", "attn_k", "attn_q", "attn_output",
    "ffn_up", "ffn_gate", "ffn_down", "other",
)
V_LIKE = frozenset({V, QKV, KV_B})

_CATEGORY_SUBSTRINGS: tuple[tuple[str, str], ...] = (
    ("attn_qkv.weight", QKV),
    ("attn_kv_b.weight", KV_B),
    ("attn_v.weight", V),
    ("attn_k.weight", K),
    ("attn_q.weight", Q_),
    ("attn_output.weight", ATTN_OUT),
    ("ffn_up", FFN_UP),
    ("ffn_gate", FFN_GATE),
    ("ffn_down", FFN_DOWN),
)


def tensor_category(name: str) -> str:
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for sub, category in _CATEGORY_SUBSTRINGS:
        if sub in name:
            return category
    return OTHER


_LAYER_RE = re.compile(r"blk\.\s*([+-]?\d+)")


def layer_of(name: str) -> int | None:
    """The layer as ``sscanf(name, "blk.%d.")`` reads it, or None."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def processing_order_key(name: str) -> tuple[int, bytes]:
    """The model loader's map order: layer number (−1 without one), then the name's bytes."""
    layer = layer_of(name)
    return (-1 if layer is None else layer, name.encode())


# ---------------------------------------------------------------------------------------------
# Shape fallback (``tensor_type_fallback``)
# ---------------------------------------------------------------------------------------------

def fallback_type(qtype: GGMLQuantizationType, ncols: int, name: str) -> GGMLQuantizationType:
    """The type used instead of ``qtype`` when ``ncols`` (ne[0]) is not a multiple of its block (the
    type table's ``fallback``, formats/ggml_types.py)."""
    fallback = type_info(qtype).fallback
    if fallback is None:
        raise NoFallbackError(
            f"tensor {name}: ncols {ncols} is not divisible by {block_size(qtype)} "
            f"(required for type {ggml_type_name(qtype)}) and no tensor type fallback is defined "
            f"for type {ggml_type_name(qtype)}"
        )
    new = Q[fallback]
    return new if ncols % block_size(new) == 0 else Q.F16


# ---------------------------------------------------------------------------------------------
# The mixture rules (``llama_tensor_get_type``) and the outer procedure (``llama_model_quantize_impl``)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]  # GGUF order, ne0 first
    source: GGMLQuantizationType
    target: GGMLQuantizationType
    category: str
    quantizable: bool  # tensor_allows_quantization; False means copied unchanged
    manual: bool  # decided by a --tensor-type pattern
    fallback_from: GGMLQuantizationType | None  # the type tensor_type_fallback replaced, if it fired
    requires_imatrix: bool

    @property
    def fallback(self) -> bool:
        return self.fallback_from is not None

    @property
    def changes_type(self) -> bool:
        return self.target != self.source


@dataclass(frozen=True)
class TypePlan:
    ftype: FileType
    tensors: tuple[TensorPlan, ...]  # in llama.cpp's processing order
    n_fallback: int
    has_imatrix: bool

    def types(self) -> dict[str, GGMLQuantizationType]:
        return {t.name: t.target for t in self.tensors}

    @property
    def imatrix_required_by(self) -> tuple[TensorPlan, ...]:
        """Tensors whose target needs an imatrix (llama.cpp refuses to run without one)."""
        return tuple(t for t in self.tensors if t.requires_imatrix)

    @property
    def manual(self) -> tuple[TensorPlan, ...]:
        return tuple(t for t in self.tensors if t.manual)

    def override_notices(self) -> list[tuple[str, GGMLQuantizationType, GGMLQuantizationType]]:
        """``(name, default, pattern type)`` for the manual tensors whose pattern changed the type:
        the ones llama.cpp prints "applying manual override: D -> T" for."""
        d = self.ftype.default
        out = []
        for t in self.tensors:
            chosen = t.fallback_from or t.target
            if t.manual and d is not None and chosen != d:
                out.append((t.name, d, chosen))
        return out


#: the file types whose own rules (rule D) replace the generic ones
_IQ12_FTYPES = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})


class _Mixture:
    """llama_tensor_get_type_impl with its running counters (quantize_state_impl)."""

    def __init__(self, facts: ModelFacts, ftype: FileType, has_imatrix: bool, has_output: bool,
                 output_tensor_type: GGMLQuantizationType | None, n_attention_wv: int) -> None:
        self.m = facts
        self.ft = ftype.name
        self.default = ftype.default
        self.has_imatrix = has_imatrix
        self.has_output = has_output
        self.output_tensor_type = output_tensor_type
        self.n_attention_wv = n_attention_wv
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        """(i_layer, n_layer) for the FFN rules: the running counter for dense models, the
        ``blk.N.`` number for MoE, where experts are not stored in layer order."""
        n_layer = self.m.n_layer
        if self.m.n_expert <= 1:
            return counter, n_layer
        i_layer = layer_of(name)
        if i_layer is None:
            raise PolicyError(f"failed to determine the layer of tensor {name} (MoE models need 'blk.N.' names)")
        if not 0 <= i_layer < n_layer:
            raise PolicyError(f"bad layer {i_layer} for tensor {name}: must be in [0, {n_layer})")
        return i_layer, n_layer

    def __call__(self, name: str, shape: Sequence[int], category: str) -> GGMLQuantizationType:
        ft, m, t = self.ft, self.m, self.default
        assert t is not None
        ne0 = int(shape[0])

        # A. output, and token_embd when the embeddings are tied
        if category == OUTPUT or (category == TOKEN_EMBD and not self.has_output):
            if self.output_tensor_type is not None:
                return self.output_tensor_type
            if ft == "MXFP4_MOE" or m.is_falcon or ne0 % block_size(t) != 0:
                return Q.Q8_0
            if ft in _IQ12_FTYPES or ft == "IQ3_XXS":
                return Q.Q5_K
            return Q.Q6_K if t != Q.Q8_0 else t

        # B. MXFP4_MOE: the experts (3-D, ne[2] > 1) MXFP4, everything else Q8_0; no counter moves
        if ft == "MXFP4_MOE":
            experts = len(shape) > 2 and int(shape[2]) > 1
            if m.arch == "bailingmoe3":
                experts = experts and category in (FFN_UP, FFN_GATE, FFN_DOWN)
            return Q.MXFP4 if experts else Q.Q8_0

        # C. untied token_embd
        if category == TOKEN_EMBD:
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return Q.Q2_K
            if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
                return Q.IQ3_S
            if ft in ("TQ1_0", "TQ2_0", "Q2_0"):
                return Q.Q4_K
            return t

        # D. the 1- and 2-bit IQ file types: their own rules (ffn_gate / ffn_up counters do not move)
        if ft in _IQ12_FTYPES:
            iq2_sm = ft in ("IQ2_S", "IQ2_M")
            if category in V_LIKE:
                self.i_attention_wv += 1
                if m.n_gqa >= 4 or m.n_expert >= 4:
                    return Q.Q4_K
                return Q.IQ3_S if iq2_sm else Q.Q2_K
            if category == K and m.n_expert == 8:
                return Q.Q4_K
            if category == FFN_DOWN:
                i = self.i_ffn_down
                self.i_ffn_down += 1
                if i < m.n_layer // 8:
                    return Q.IQ3_S if iq2_sm else Q.Q2_K
                return t
            if category == ATTN_OUT:
                if m.n_expert == 8:
                    return Q.Q5_K
                if ft in ("IQ1_S", "IQ1_M"):
                    return Q.IQ2_XXS
                return Q.IQ3_S if iq2_sm else t
            return t

        # E. V-like
        if category in V_LIKE:
            i, n = self.i_attention_wv, self.n_attention_wv
            if ft == "Q2_K":
                t = Q.Q4_K if m.n_gqa >= 4 else Q.Q3_K
            elif ft == "Q2_K_S" and m.n_gqa >= 4:
                t = Q.Q4_K
            elif ft == "IQ3_XXS":
                t = Q.Q4_K if m.n_gqa >= 4 else Q.IQ3_S if not self.has_imatrix else Q.IQ3_XXS
            elif ft in ("IQ3_XS", "IQ3_S") and m.n_gqa >= 4:
                t = Q.Q4_K
            elif ft == "IQ3_M":
                t = Q.Q4_K
            elif ft == "Q3_K_M":
                t = Q.Q5_K if i < 2 else Q.Q4_K
            elif ft == "Q3_K_L":
                t = Q.Q5_K
            elif ft in ("IQ4_NL", "IQ4_XS") and m.n_gqa >= 4:
                t = Q.Q5_K
            elif ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
                t = Q.Q6_K
            elif ft == "Q4_K_S" and i < 4:
                t = Q.Q5_K
            if m.is_70b and t in (Q.Q3_K, Q.Q4_K):
                t = Q.Q5_K
            if m.n_expert == 8:
                t = Q.Q8_0
            self.i_attention_wv += 1
            return t

        # F. attn_k, G. attn_q
        if category == K:
            if m.n_expert == 8:
                return Q.Q8_0
            return {"IQ3_XS": Q.IQ3_XXS, "IQ3_XXS": Q.IQ2_S}.get(ft, t)
        if category == Q_:
            return {"IQ3_XS": Q.IQ3_XXS, "IQ3_XXS": Q.IQ2_S}.get(ft, t)

        # H. ffn_down
        if category == FFN_DOWN:
            i, n = self._layer(self.i_ffn_down, name)
            if ft == "Q2_K":
                t = Q.Q3_K
            elif ft == "Q2_K_S":
                if i < n // 8:
                    t = Q.Q4_K
            elif ft == "IQ3_XXS" and not self.has_imatrix:
                t = Q.Q4_K if i < n // 8 else Q.Q3_K
            elif ft == "Q3_K_M":
                t = Q.Q5_K if i < n // 16 else Q.Q4_K if (not m.is_falcon or use_more_bits(i, n)) else Q.Q3_K
            elif ft == "IQ3_M" and (i < n // 8 or (m.n_expert == 8 and use_more_bits(i, n))):
                t = Q.Q4_K
            elif ft == "Q3_K_L":
                t = Q.Q4_K if m.is_falcon else Q.Q5_K
            elif ft == "Q4_K_M":
                if m.is_falcon:
                    t = Q.Q6_K if i < n // 16 else Q.Q5_K if use_more_bits(i, n) else Q.Q4_K
                elif use_more_bits(i, n):
                    t = Q.Q6_K
            elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not self.has_imatrix:
                t = Q.Q5_K
            elif ft == "Q5_K_M" and use_more_bits(i, n):
                t = Q.Q6_K
            elif ft == "Q4_K_S" and not m.is_falcon and i < n // 8:
                t = Q.Q5_K
            elif ft in ("Q4_0", "Q5_0") and self.has_imatrix and i < n // 8:
                t = Q.Q4_1 if ft == "Q4_0" else Q.Q5_1
            self.i_ffn_down += 1
            return t

        # I. attn_output
        if category == ATTN_OUT:
            if m.is_falcon:
                return Q.Q4_K if ft == "Q3_K_L" else t
            if m.n_expert == 8:
                if ft in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S",
                          "IQ3_M", "IQ4_XS"):
                    return Q.Q5_K
                return t
            return {"Q2_K": Q.Q3_K, "IQ3_XXS": Q.IQ3_S, "Q3_K_M": Q.Q4_K, "Q3_K_L": Q.Q5_K,
                    "IQ3_M": Q.Q4_K}.get(ft, t)

        # J. (attn_qkv's own rules are unreachable: rule E takes every V-like tensor first)
        # K. ffn_gate / ffn_up: IQ3_XS gives the middle layers IQ3_XXS; the layer is resolved for every
        # file type (an MoE name without 'blk.N.' is an error) and the counter advances.
        if category in (FFN_GATE, FFN_UP):
            counter = "i_ffn_gate" if category == FFN_GATE else "i_ffn_up"
            i, n = self._layer(getattr(self, counter), name)
            setattr(self, counter, getattr(self, counter) + 1)
            if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                return Q.IQ3_XXS
            return t

        # L. everything else
        return t


def plan_types(
    metadata: Mapping[str, Any],
    tensors: Iterable[tuple[str, Sequence[int], Any]],
    ftype: str | int | FileType,
    *,
    pure: bool = False,
    has_imatrix: bool = False,
    output_tensor_type: str | GGMLQuantizationType | None = None,
    token_embedding_type: str | GGMLQuantizationType | None = None,
    tensor_types: Sequence[tuple[str, str | GGMLQuantizationType]] = (),
    leave_output_tensor: bool = False,
    in_given_order: bool = False,
) -> TypePlan:
    """Decide every tensor's type as llama_model_quantize's preliminary pass does (``llama_tensor_get_type`` per tensor, with the fallback).

    Tensors are taken in the model loader's order (by layer, then name) unless ``in_given_order``:
    llama-quantize --keep-split takes them by (input part, offset), and the rules' running counters
    see that order.

    ``tensor_types`` are ``(regex, type)`` pairs in command-line order; the first pattern found
    anywhere in a tensor name wins. Patterns are used as given (``parse_tensor_type_arg`` lower-cases
    them the way llama-quantize does).
    """
    ft = parse_ftype(ftype)
    facts = ModelFacts.from_metadata(metadata)
    out_type = None if output_tensor_type is None else parse_ggml_type(output_tensor_type)
    embd_type = None if token_embedding_type is None else parse_ggml_type(token_embedding_type)
    patterns = [(compile_pattern(p), parse_ggml_type(qt)) for p, qt in tensor_types]

    items = [(str(name), tuple(int(d) for d in shape), parse_ggml_type(qt)) for name, shape, qt in tensors]
    seen: set[str] = set()
    for name, _, _ in items:
        if name in seen:
            raise PolicyError(f"duplicate tensor name {name}")
        seen.add(name)
    if not in_given_order:
        items.sort(key=lambda item: processing_order_key(item[0]))

    has_output = "output.weight" in seen
    n_attention_wv = sum(1 for name, _, _ in items if tensor_category(name) in V_LIKE)
    mix = _Mixture(facts, ft, has_imatrix, has_output, out_type, n_attention_wv)

    plans: list[TensorPlan] = []
    n_fallback = 0
    for name, shape, source in items:
        category = tensor_category(name)
        manual = False
        fallback_from = None
        quantizable = not ft.only_copy and tensor_allows_quantization(
            name, shape, leave_output_tensor=leave_output_tensor)
        if not quantizable:
            target = source
        elif category == TOKEN_EMBD and embd_type is not None:
            target = embd_type
        elif category == OUTPUT and out_type is not None:
            target = out_type
        elif not ft.is_quantized:
            assert ft.default is not None
            target = ft.default
        else:
            assert ft.default is not None
            target = ft.default
            for regex, qtype in patterns:
                if regex.search(name):
                    target, manual = qtype, True
                    break
            if not manual and not pure:
                target = mix(name, shape, category)
            ncols = shape[0]
            if ncols % block_size(target) != 0:
                fallback_from = target
                target = fallback_type(target, ncols, name)
                n_fallback += 1
        requires_imatrix = quantizable and category not in (OUTPUT, TOKEN_EMBD) and (
            type_info(target).needs_imatrix or (ft.name == "Q2_K_S" and target == Q.Q2_K))
        plans.append(TensorPlan(name, shape, source, target, category, quantizable, manual,
                                fallback_from, requires_imatrix))
    return TypePlan(ft, tuple(plans), n_fallback, has_imatrix)


def choose_types(metadata: Mapping[str, Any], tensors: Iterable[tuple[str, Sequence[int], Any]],
                 ftype: str | int | FileType, **options: Any) -> dict[str, GGMLQuantizationType]:
    """``{tensor name: target type}``; ``options`` and the decision are ``plan_types``'s."""
    return plan_types(metadata, tensors, ftype, **options).types()
