"""The model cell of llama-bench's tables: ``llama_model_desc`` ("<arch> <size label> <file type>"), the
size and the parameter count of a GGUF file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from quantkit.formats.ggml_types import ftype_label, guess_ftype


def ftype_name(meta: dict[str, Any], tensor_types: list[tuple[str, str]]) -> str:
    """``general.file_type`` when present, else guessed like llama.cpp (prefixed "(guessed) ")."""
    if "general.file_type" in meta:
        return ftype_label(int(meta["general.file_type"]))

    def key(item):  # weights_map's order: layer number (-1 outside blk.N.), then name
        m = re.match(r"blk\.(-?\d+)\.", item[0])
        return (int(m.group(1)) if m else -1, item[0].encode())

    return "(guessed) " + guess_ftype(t for _, t in sorted(tensor_types, key=key)).label


#: per architecture, llama.cpp's size label from (metadata, layers, n_embd, n_head) (each
#: ``load_arch_hparams``); None: unknown
_SIZE_LABELS = {
    "qwen2": lambda meta, n_layer, n_embd, n_head: {
        24: "0.5B" if n_embd == 1024 else "1B", 28: "1.5B" if n_embd == 1536 else "7B", 32: "7B", 36: "3B",
        40: "4B" if n_head == 20 else "13B", 48: "14B", 64: "32B", 80: "70B"}.get(n_layer),
    "qwen3": lambda meta, n_layer, n_embd, n_head: {
        28: "0.6B" if n_embd == 1024 else "1.7B", 36: "4B" if n_embd == 2560 else "8B", 40: "14B",
        64: "32B"}.get(n_layer),
    "gemma3": lambda meta, n_layer, n_embd, n_head: {
        18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}.get(n_layer),
    "llama": lambda meta, n_layer, n_embd, n_head: _llama_size_label(meta, n_layer, n_head),
    # llama_model_qwen3next::load_arch_hparams: by hparams.n_layer(), the blocks without the MTP ones
    "qwen3next": lambda meta, n_layer, n_embd, n_head: {48: "80B.A3B"}.get(
        n_layer - int(meta.get("qwen3next.nextn_predict_layers", 0) or 0)),
}


def size_label(meta: dict[str, Any]) -> str:
    """llama.cpp's ``llm_type_name`` as each architecture's ``load_arch_hparams`` sets it (src/models/
    llama.cpp, qwen2.cpp, qwen3.cpp, gemma3.cpp), "?B" when unknown."""
    arch = str(meta.get("general.architecture", ""))
    n_layer = int(meta.get(f"{arch}.block_count", 0) or 0)
    n_embd = int(meta.get(f"{arch}.embedding_length", 0) or 0)
    n_head = int(meta.get(f"{arch}.attention.head_count", 0) or 0)
    label = _SIZE_LABELS.get(arch)
    return (label(meta, n_layer, n_embd, n_head) if label else None) or "?B"


def _llama_size_label(meta: dict[str, Any], n_layer: int, n_head: int) -> str:
    """src/models/llama.cpp's labels: Mixtral's by layers, the dense ones by layers, vocabulary and GQA."""
    arch = "llama"
    n_expert = int(meta.get(f"{arch}.expert_count", 0) or 0)
    n_vocab = meta.get(f"{arch}.vocab_size")
    if n_vocab is None:
        n_vocab = len(meta.get("tokenizer.ggml.tokens", []) or [])
    n_head_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head) or 0)
    if n_expert == 8:
        return {32: "8x7B", 56: "8x22B"}.get(n_layer, "?B")
    if n_layer == 32:
        return "3B" if n_vocab == 49152 else ("7B" if n_vocab < 40000 else "8B")
    if n_layer == 80:
        return "65B" if n_head == n_head_kv else "70B"
    return {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B", 48: "34B",
            60: "30B"}.get(n_layer, "?B")


@dataclass(frozen=True)
class ModelInfo:
    filename: str
    desc: str       # llama_model_desc: "<arch> <size label> <file type>"
    size: int       # bytes of all tensors (llama_model_size)
    n_params: int   # elements of all tensors (llama_model_n_params)
    file_size: int
    #: the types of its matrices (2-D or more), by ggml id: the ones whose kernels a test runs
    matrix_types: tuple[str, ...] = ()


def model_info(path: str, gg) -> ModelInfo:
    """From an open ``GGUFModel``."""
    meta = gg.metadata
    arch = str(meta.get("general.architecture", "")) or "unknown"
    ft = ftype_name(meta, [(t.name, t.type.name) for t in gg.tensors])
    return ModelInfo(path, f"{arch} {size_label(meta)} {ft}", sum(t.nbytes for t in gg.tensors),
                     sum(t.n_elements for t in gg.tensors), int(gg.file_size),
                     tuple(t.name for t in sorted({t.type for t in gg.tensors if len(t.shape) >= 2}, key=int)))
